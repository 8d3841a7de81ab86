"""Runtime parameters: stored per vhost in the definitions journal, announced to the
broker's listeners, restored after a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streamq.broker.broker import Broker
from streamq.broker.errors import NotFound
from streamq.broker.link_definitions import ParameterInvalid, ShovelDefinition
from streamq.broker.parameters import ComponentNotFound

SHOVEL = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}
Heard = list[tuple[str, str, str, object]]


def _listener(heard: Heard):  # type: ignore[no-untyped-def]
    return lambda vhost, component, name, value: heard.append((vhost, component, name, value))


def test_put_get_list_delete(tmp_path: Path) -> None:
    broker = Broker(str(tmp_path))
    try:
        parameters = broker.vhost("/").parameters
        assert parameters.put("shovel", "s1", SHOVEL, "guest") is True
        assert parameters.put("shovel", "s1", {**SHOVEL, "dest-queue": "c"}, "guest") is False
        parameters.put("federation-upstream", "up", {"uri": "amqp://h"}, "admin")
        assert parameters.get("shovel", "s1") == {**SHOVEL, "dest-queue": "c"}
        assert [(p.component, p.name) for p in parameters.list()] == [
            ("federation-upstream", "up"),
            ("shovel", "s1"),
        ]
        assert [p.name for p in parameters.list("shovel")] == ["s1"]
        found = parameters.parameter("shovel", "s1")
        assert found is not None and found.user == "guest"
        assert isinstance(found.definition, ShovelDefinition)
        assert found.to_json() == {
            "value": {**SHOVEL, "dest-queue": "c"},
            "vhost": "/",
            "component": "shovel",
            "name": "s1",
        }
        parameters.delete("shovel", "s1")
        assert parameters.get("shovel", "s1") is None
        with pytest.raises(NotFound):
            parameters.delete("shovel", "s1")
    finally:
        broker.close()


def test_a_bad_value_changes_nothing(tmp_path: Path) -> None:
    broker = Broker(str(tmp_path))
    try:
        parameters = broker.vhost("/").parameters
        heard: Heard = []
        broker.parameter_listeners.append(_listener(heard))
        parameters.put("shovel", "s1", SHOVEL, "guest")
        with pytest.raises(ParameterInvalid, match="Unrecognised terms"):
            parameters.put("shovel", "s1", {**SHOVEL, "extra": 1}, "guest")
        with pytest.raises(ComponentNotFound):
            parameters.put("mqtt", "s1", SHOVEL, "guest")
        with pytest.raises(ParameterInvalid, match="1 to 255 bytes"):
            parameters.put("shovel", "", SHOVEL, "guest")
        assert parameters.get("shovel", "s1") == SHOVEL
        assert heard == [("/", "shovel", "s1", SHOVEL)]
    finally:
        broker.close()


def test_listeners_hear_existing_parameters_then_changes(tmp_path: Path) -> None:
    broker = Broker(str(tmp_path))
    try:
        parameters = broker.vhost("/").parameters
        parameters.put("shovel", "before", SHOVEL, "guest")
        heard: Heard = []
        broker.parameter_listeners.append(_listener(heard))
        assert heard == [("/", "shovel", "before", SHOVEL)]
        parameters.put("shovel", "after", SHOVEL, "guest")
        parameters.delete("shovel", "before")
        assert heard[1:] == [("/", "shovel", "after", SHOVEL), ("/", "shovel", "before", None)]
    finally:
        broker.close()


def test_a_failing_listener_does_not_stop_the_others(tmp_path: Path) -> None:
    broker = Broker(str(tmp_path))
    try:
        heard: Heard = []

        def failing(vhost: str, component: str, name: str, value: object) -> None:
            raise RuntimeError("boom")

        broker.parameter_listeners.append(failing)
        broker.parameter_listeners.append(_listener(heard))
        broker.vhost("/").parameters.put("shovel", "s1", SHOVEL, "guest")
        assert heard == [("/", "shovel", "s1", SHOVEL)]
    finally:
        broker.close()


def test_parameters_survive_a_restart_and_compaction(tmp_path: Path) -> None:
    broker = Broker(str(tmp_path))
    vhost = broker.vhost("/")
    for i in range(300):  # enough replaced records for the start-up compaction
        vhost.parameters.put("shovel", "s1", {**SHOVEL, "src-prefetch-count": i}, "guest")
    vhost.parameters.put("federation-upstream-set", "set", [{"upstream": "u"}], "guest")
    vhost.parameters.put("shovel", "gone", SHOVEL, "guest")
    vhost.parameters.delete("shovel", "gone")
    asyncio.run(vhost.sync_all())
    broker.close()
    for _ in range(2):  # the compacted file too
        broker = Broker(str(tmp_path))
        try:
            parameters = broker.vhost("/").parameters
            assert [(p.component, p.name) for p in parameters.list()] == [
                ("federation-upstream-set", "set"),
                ("shovel", "s1"),
            ]
            assert parameters.get("shovel", "s1") == {**SHOVEL, "src-prefetch-count": 299}
            found = parameters.parameter("shovel", "s1")
            assert found is not None and found.user == "guest"
        finally:
            broker.close()


def test_deleting_a_vhost_announces_its_parameters_gone(tmp_path: Path) -> None:
    async def scenario() -> Heard:
        broker = Broker(str(tmp_path))
        try:
            vhost = await broker.create_vhost("edge")
            assert vhost is not None
            vhost.parameters.put("shovel", "s1", SHOVEL, "guest")
            heard: Heard = []
            broker.parameter_listeners.append(_listener(heard))
            await broker.delete_vhost("edge")
            return heard
        finally:
            await broker.aclose()

    assert asyncio.run(scenario()) == [
        ("edge", "shovel", "s1", SHOVEL),
        ("edge", "shovel", "s1", None),
    ]
