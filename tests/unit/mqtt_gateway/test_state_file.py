"""The MQTT stores' whole-file writer (mqtt_gateway/state_file.py): a flush writes what
the state is when it runs, only when something changed, and a change made while a write
runs goes in the next one."""

from __future__ import annotations

import asyncio
from pathlib import Path

from mqtt_gateway.state_file import StateFile


async def test_a_flush_writes_only_after_a_change(tmp_path: Path) -> None:
    state = StateFile(str(tmp_path), "state")
    assert state.read() is None
    encoded: list[bytes] = []

    def encode() -> bytes:
        encoded.append(b"one")
        return b"one"

    await state.flush(encode)
    assert encoded == [] and not state.dirty
    state.changed()
    assert state.dirty
    await state.flush(encode)
    assert encoded == [b"one"] and not state.dirty
    assert state.read() == b"one"
    await state.flush(encode)
    assert encoded == [b"one"]


async def test_a_change_during_a_write_goes_in_the_next_one(tmp_path: Path) -> None:
    state = StateFile(str(tmp_path), "state")
    value = [b"first"]
    state.changed()

    def encode() -> bytes:
        written = value[0]
        value[0] = b"second"  # changed in memory while this write runs
        state.changed()
        return written

    await asyncio.gather(state.flush(encode), state.flush(lambda: value[0]))
    assert state.read() == b"second" and not state.dirty
