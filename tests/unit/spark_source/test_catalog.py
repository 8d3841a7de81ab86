"""streamPattern discovery: stream names replayed from a definitions journal written by
the broker's own encoder, matched in full, and only when the stream's log exists."""

from __future__ import annotations

import os
from pathlib import Path

from spark_source.catalog import matching_streams, queue_names
from spark_source.logdir import stream_directory
from streamq.broker.definitions import encode_file, encode_record
from tests.unit.spark_source.conftest import StreamWriter

STREAM = {"x-queue-type": "stream"}


def queue(name: str, arguments: dict[str, object]) -> dict[str, object]:
    return {"op": "queue", "name": name, "auto_delete": False, "arguments": arguments}


def test_replay_keeps_live_queues_and_stops_at_a_torn_tail() -> None:
    ops = [
        queue("a", STREAM),
        queue("work", {}),
        queue("gone", STREAM),
        {"op": "queue.delete", "name": "gone"},
        {"op": "exchange", "name": "x", "type": "direct"},
    ]
    data = encode_file(ops)
    assert queue_names(data) == {"a": "stream", "work": ""}
    torn = data + encode_record(queue("late", STREAM))[:-3]
    assert queue_names(torn) == {"a": "stream", "work": ""}
    assert queue_names(b"nope") == {}


def test_matching_streams(tmp_path: Path, write_stream: StreamWriter) -> None:
    write_stream("orders.eu", 1)
    write_stream("orders.us", 1)
    write_stream("other", 1)
    ops = [queue(name, STREAM) for name in ("orders.eu", "orders.us", "other", "orders.xx")]
    vhost_dir = os.path.dirname(os.path.dirname(stream_directory(str(tmp_path), "/", "x")))
    with open(os.path.join(vhost_dir, "definitions"), "wb") as f:
        f.write(encode_file([*ops, queue("orders.work", {})]))
    # orders.xx has no log directory; orders.work is a classic queue; "orders" is no match.
    assert matching_streams(str(tmp_path), "/", r"orders\..*") == ("orders.eu", "orders.us")
    assert matching_streams(str(tmp_path), "/", "orders") == ()
    assert matching_streams(str(tmp_path), "other-vhost", ".*") == ()
