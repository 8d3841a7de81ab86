"""QoS 2 deliveries to a subscriber: the sender's half of the exactly-once handshake.

Owns what PUBREC and PUBCOMP from the client do (MQTT 5.0 section 4.3.3, the sender's
side; MQTT-4.4): a delivery sent as PUBLISH QoS 2 is in flight (`MqttSession.inflight`)
until its PUBREC; then the message is settled (acked) on its queue, the packet
identifier moves to `MqttSession.pubrel` and PUBREL goes out; PUBCOMP frees the
identifier. Every delivery in flight or awaiting PUBCOMP counts against the client's
Receive Maximum (section 4.9).

For a persistent session the PUBREL state is on disk (`PubrelStore`) in this order:
the entry is written before the ack is settled (the PUBREL and the settle wait for the
store's write, `MqttSession.reply(settle=...)`), and removed after PUBCOMP only once a
round of the vhost has made the ack durable (`_forget_loop`). So a broker stopped
anywhere in between finds either the message unacked and no entry (it was never the
client's: sent again, with DUP), or the entry (PUBREL sent again on reconnection,
MQTT-4.4.0-1; the message skipped if its queue offers it again, to whichever consumer:
`PubrelStore.recovered`). A clean session keeps the state in memory only. Nothing here
reads a socket.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from mqtt_gateway.codec import ProtocolLevel, PubRec, PubRel, ReasonCode
from mqtt_gateway.pubrel_store import Released
from streamq.log.errors import LogError

if TYPE_CHECKING:
    from mqtt_gateway.confirms import Inflight
    from mqtt_gateway.session import MqttSession

logger = logging.getLogger(__name__)

RETAINED: Final[Released] = ("", 0)
"""The PUBREL state of a retained message sent at QoS 2 (it is on no queue)."""
_ERROR_FROM: Final = 0x80  # PUBREC reason codes from here on refuse the message


def pubrec(s: MqttSession, packet: PubRec) -> None:
    """The client has the message: settle it, PUBREL (after its state is on disk)."""
    packet_id = packet.packet_id
    held = s.inflight.pop(packet_id, None)
    if held is None:
        _pubrec_unknown(s, packet_id)
        return
    if packet.reason_code >= _ERROR_FROM:
        # 5.0: the client refused it; the exchange ends here, no PUBREL (4.3.3).
        settle(s, held)
        s.kick()
        return
    queue, offset, _consumer = held
    released = (queue.name, offset)
    s.pubrel[packet_id] = released
    if s.persistent:
        vhost = s.vhost
        assert vhost is not None
        s.gateway.pubrel(vhost).add(s.client_id, packet_id, released)
        s.reply(PubRel(packet_id), settle=held)
    else:
        settle(s, held)
        s.reply(PubRel(packet_id))


def _pubrec_unknown(s: MqttSession, packet_id: int) -> None:
    if packet_id in s.pubrel:
        s.reply(PubRel(packet_id))  # a repeated PUBREC: the same PUBREL again
        return
    if packet_id in s.retained_inflight:
        # A retained message at QoS 2: no queue to settle.
        s.retained_inflight.discard(packet_id)
        s.pubrel[packet_id] = RETAINED
        if s.persistent:
            vhost = s.vhost
            assert vhost is not None
            s.gateway.pubrel(vhost).add(s.client_id, packet_id, RETAINED)
            s.reply(PubRel(packet_id), durable=True)
        else:
            s.reply(PubRel(packet_id))
        return
    v5 = s.level is ProtocolLevel.MQTT_5
    s.reply(PubRel(packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND if v5 else 0))


def pubcomp(s: MqttSession, packet_id: int) -> None:
    """The handshake is over: the identifier is free, the Receive Maximum's quota
    returns; a persistent session's entry goes once the ack is durable."""
    released = s.pubrel.pop(packet_id, None)
    if released is None:
        return  # an unknown identifier: PUBCOMP has no answer to give
    if s.persistent:
        s.pubcomps.append((packet_id, released))
        if not s.forgetting:
            s.forgetting = True
            s.spawn(_forget_loop(s))
    s.kick()


async def _forget_loop(s: MqttSession) -> None:
    vhost = s.vhost
    assert vhost is not None
    store = s.gateway.pubrel(vhost)
    try:
        while s.pubcomps and not s.closed:
            await vhost.sync_all()  # the acks settled at PUBREC are durable
            done, s.pubcomps = s.pubcomps, []
            for packet_id, released in done:
                store.remove(s.client_id, packet_id, released)
            await store.flush()
    except (LogError, OSError) as exc:
        # The entries stay: on reconnection the client gets a PUBREL it answers again.
        logger.error("PUBREL state of MQTT client '%s' not written: %s", s.client_id, exc)
    finally:
        s.forgetting = False


def settle(s: MqttSession, held: Inflight) -> None:
    """The message left its queue for good (the client has it, or refused it)."""
    queue, offset, consumer = held
    vhost = s.vhost
    assert vhost is not None
    queue.stats.ack += 1
    vhost.settle(queue, offset, consumer)
    vhost.kick(queue)


def load(s: MqttSession) -> None:
    """A persistent session's connection starts: its PUBREL state from the store."""
    vhost = s.vhost
    assert vhost is not None
    s.pubrel = s.gateway.pubrel(vhost).of(s.client_id)


def send_pubrels(s: MqttSession) -> None:
    """Each PUBREL again, after the CONNACK (MQTT-4.4.0-1)."""
    for packet_id in sorted(s.pubrel):
        s.reply(PubRel(packet_id))
