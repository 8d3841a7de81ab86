"""A vhost's runtime parameters: RabbitMQ's component/name/value store for shovels and
federation upstreams (and upstream sets).

Owns the parameters of one vhost of components "shovel", "federation-upstream" and
"federation-upstream-set" (operator policies, which RabbitMQ also keeps as parameters,
keep their own code in `vhost_policies.py`): each value is validated on the way in
(`link_definitions`), recorded in the vhost's definitions journal (ops "parameter" and
"parameter.delete", durable after the vhost's next sync round with companions, as
policies), and announced through `notify` so that the links runtime starts, replaces or
stops what runs from it. Replay at start-up restores them without announcing anything:
the broker announces every parameter to each listener it gets (`Broker.parameter_listeners`).
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from streamq.broker.errors import BrokerError, NotFound
from streamq.broker.link_definitions import (
    COMPONENTS,
    Definition,
    ParameterInvalid,
    parse_value,
)

logger = logging.getLogger(__name__)

PARAMETERS_PER_VHOST_MAX: Final = 10_000
NAME_BYTES_MAX: Final = 255
VALUE_BYTES_MAX: Final = 256 * 1024  # one value as JSON; RabbitMQ's are a few hundred bytes

# (vhost, component, name, value or None when deleted)
ParameterListener = Callable[[str, str, str, object | None], None]


class ComponentNotFound(BrokerError):
    """A component streamq has no runtime parameters of (RabbitMQ's 404)."""

    def __init__(self, component: str) -> None:
        super().__init__(f"component {component!r} not found")
        self.component = component


@dataclass(frozen=True, slots=True)
class Parameter:
    """One runtime parameter; `user` set it (a shovel's "amqp://" connects as that user,
    as RabbitMQ's direct connections do)."""

    vhost: str
    component: str
    name: str
    value: object  # JSON: an object, or a list for an upstream set
    user: str
    definition: Definition

    def to_json(self) -> dict[str, object]:
        """As RabbitMQ's `/api/parameters` and definitions export show it."""
        return {
            "value": self.value,
            "vhost": self.vhost,
            "component": self.component,
            "name": self.name,
        }


def check_component(component: str) -> None:
    if component not in COMPONENTS:
        raise ComponentNotFound(component)


def _check_name(name: str) -> None:
    if not name or len(name.encode("utf-8", "surrogateescape")) > NAME_BYTES_MAX:
        raise ParameterInvalid(f"a parameter name is 1 to {NAME_BYTES_MAX} bytes")


def _check_size(value: object) -> None:
    try:
        size = len(json.dumps(value, ensure_ascii=False).encode())
    except (TypeError, ValueError) as exc:
        raise ParameterInvalid(f"the value is not JSON: {exc}") from None
    if size > VALUE_BYTES_MAX:
        raise ParameterInvalid(f"the value is larger than {VALUE_BYTES_MAX} bytes as JSON")


class RuntimeParameters:
    """The parameters of one vhost (event-loop thread only)."""

    def __init__(self, vhost: str, record: Callable[[dict[str, object]], None]) -> None:
        """`record` appends an op to the vhost's definitions journal."""
        self.vhost = vhost
        self._record = record
        self._table: dict[tuple[str, str], Parameter] = {}
        self.notify: ParameterListener = lambda vhost, component, name, value: None

    def put(self, component: str, name: str, value: object, user: str) -> bool:
        """Add or replace a parameter and announce it. True if it is new. Buffered:
        durable after the vhost's next sync round with companions (`sync_all`).
        Raises ComponentNotFound, ParameterInvalid (and then nothing changed)."""
        check_component(component)
        _check_name(name)
        _check_size(value)
        definition = parse_value(component, value)
        key = (component, name)
        created = key not in self._table
        if created and len(self._table) >= PARAMETERS_PER_VHOST_MAX:
            raise ParameterInvalid(f"a vhost holds at most {PARAMETERS_PER_VHOST_MAX} parameters")
        parameter = Parameter(self.vhost, component, name, value, user, definition)
        self._table[key] = parameter
        self._record(parameter_op(parameter))
        self.notify(self.vhost, component, name, value)
        return created

    def delete(self, component: str, name: str) -> None:
        """Remove a parameter and announce it (value None). Buffered as `put`.
        Raises ComponentNotFound, NotFound."""
        check_component(component)
        if self._table.pop((component, name), None) is None:
            raise NotFound(component, name, self.vhost)
        self._record({"op": "parameter.delete", "component": component, "name": name})
        self.notify(self.vhost, component, name, None)

    def get(self, component: str, name: str) -> object | None:
        """The value of a parameter, None if there is none."""
        found = self._table.get((component, name))
        return None if found is None else found.value

    def parameter(self, component: str, name: str) -> Parameter | None:
        return self._table.get((component, name))

    def list(self, component: str | None = None) -> list[Parameter]:
        """The parameters of `component` (None: all), by component and name."""
        return [
            p for key, p in sorted(self._table.items()) if component is None or key[0] == component
        ]

    def __len__(self) -> int:
        return len(self._table)

    # -- the definitions journal ------------------------------------------------------------

    def restore(self, op: Mapping[str, object]) -> None:
        """Replay one "parameter" or "parameter.delete" op (no announcement). A value that
        no longer validates is logged and left out, as a policy is."""
        component, name = str(op.get("component")), str(op.get("name"))
        if op.get("op") == "parameter.delete":
            self._table.pop((component, name), None)
            return
        value = op.get("value")
        try:
            check_component(component)
            definition = parse_value(component, value)
        except (ComponentNotFound, ParameterInvalid) as exc:
            logger.error(
                "vhost %s: parameter %s/%s not restored: %s", self.vhost, component, name, exc
            )
            return
        user = str(op.get("user", ""))
        self._table[(component, name)] = Parameter(
            self.vhost, component, name, value, user, definition
        )

    def ops(self) -> builtins.list[dict[str, object]]:  # `list` is the method above
        """The journal ops that recreate every parameter (the snapshot's part)."""
        return [parameter_op(p) for _, p in sorted(self._table.items())]


def parameter_op(parameter: Parameter) -> dict[str, object]:
    return {
        "op": "parameter",
        "component": parameter.component,
        "name": parameter.name,
        "value": parameter.value,
        "user": parameter.user,
    }
