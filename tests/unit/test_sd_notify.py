"""streamq.sd_notify's reading of the environment systemd sets: NOTIFY_SOCKET as a path
or an abstract name, WATCHDOG_USEC halved, and WATCHDOG_PID naming another process
(no watchdog then). The datagrams themselves: tests/integration/test_sd_notify.py."""

from __future__ import annotations

import os

from streamq.sd_notify import Notifier, socket_address, watchdog_interval_s


def test_socket_address_forms() -> None:
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@abstract/name") == b"\0abstract/name"
    assert socket_address("") is None
    assert socket_address("@") is None
    assert socket_address("relative/path") is None


def test_watchdog_interval_is_half_of_watchdog_usec_for_this_process() -> None:
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000"}) == 15.0
    mine = {"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid())}
    assert watchdog_interval_s(mine) == 0.5
    assert watchdog_interval_s({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}) is None
    for unusable in ("", "0", "-5", "1e6", "soon"):
        assert watchdog_interval_s({"WATCHDOG_USEC": unusable}) is None, unusable


def test_without_notify_socket_nothing_is_sent_and_no_watchdog() -> None:
    quiet = Notifier.from_environment({"WATCHDOG_USEC": "1000000"})
    assert not quiet.enabled and quiet.watchdog_s is None
    assert quiet.send("READY=1") is False
