"""`streamq ctl` connection, definitions and status verbs on a running broker, over HTTP.

Owns how lavinmqctl's node-wide verbs map onto RabbitMQ's management API:
`/api/connections` (closing one sends the reason in the `X-Reason` header),
`/api/definitions` (export to a file or stdout, import from a file or stdin),
`/api/overview` (status) and `/api/nodes` (cluster_status: each node's role, in-sync
replica membership and replication lag).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Final

from streamq.ctlhttp.client import ApiClient, CtlError, JsonValue, path
from streamq.ctlhttp.output import Done, Fields, Result, Table, Value
from streamq.log.files import write_file_atomic

CONNECTION_COLUMNS: Final = ("name", "user", "vhost", "state", "channels")
CLOSE_REASON_DEFAULT: Final = "Closed via streamq ctl"
STDIO: Final = "-"
DEFINITIONS_BYTES_MAX: Final = 256 * 1024 * 1024
# The overview fields `status` shows: (label, path in the /api/overview object).
STATUS_FIELDS: Final = (
    ("product", ("product_name",)),
    ("version", ("product_version",)),
    ("node", ("node",)),
    ("connections", ("object_totals", "connections")),
    ("channels", ("object_totals", "channels")),
    ("consumers", ("object_totals", "consumers")),
    ("exchanges", ("object_totals", "exchanges")),
    ("queues", ("object_totals", "queues")),
    ("messages", ("queue_totals", "messages")),
    ("messages_ready", ("queue_totals", "messages_ready")),
    ("messages_unacknowledged", ("queue_totals", "messages_unacknowledged")),
)


CLUSTER_COLUMNS: Final = ("name", "role", "in_isr", "state", "lag_bytes", "lag_s")
STANDALONE_ROLE: Final = "standalone"  # a broker without clustering: one node, no ISR


# Connections.


def _connections(client: ApiClient, args: argparse.Namespace) -> list[dict[str, JsonValue]]:
    """The node's connections, or those of the vhost given with -p."""
    connections = client.get_list(path("connections"))
    if args.vhost_given:
        connections = [c for c in connections if c.get("vhost") == args.vhost]
    return connections


def list_connections(client: ApiClient, args: argparse.Namespace) -> Result:
    columns = tuple(args.columns) if args.columns else CONNECTION_COLUMNS
    rows = [{column: c.get(column) for column in columns} for c in _connections(client, args)]
    return Table(columns, rows)


def close_connection(client: ApiClient, args: argparse.Namespace) -> Result:
    _close(client, args.name, args.reason)
    return Done(f'Closed connection "{args.name}".')


def close_all_connections(client: ApiClient, args: argparse.Namespace) -> Result:
    closed: list[dict[str, JsonValue]] = []
    for connection in _connections(client, args):
        name = str(connection.get("name"))
        try:
            _close(client, name, args.reason)
        except CtlError as exc:
            if exc.status != 404:  # closed meanwhile: nothing left to do
                raise
            continue
        closed.append({"name": name})
    return Table(("name",), closed) if args.output_format == "json" else _closed_count(closed)


def _closed_count(closed: list[dict[str, JsonValue]]) -> Done:
    names = "".join(f"\n  {c['name']}" for c in closed)
    return Done(f"Closed {len(closed)} connection{'' if len(closed) == 1 else 's'}.{names}")


def _close(client: ApiClient, name: str, reason: str | None) -> None:
    # Header values are Latin-1 on the wire: keep the reason printable ASCII.
    text = (reason or CLOSE_REASON_DEFAULT).encode("ascii", "replace").decode()
    client.request("DELETE", path("connections", name), headers={"X-Reason": text})


# Definitions.


def _definitions_path(args: argparse.Namespace) -> str:
    return path("definitions", args.vhost) if args.vhost_given else path("definitions")


def export_definitions(client: ApiClient, args: argparse.Namespace) -> Result:
    definitions = client.get(_definitions_path(args))
    text = json.dumps(definitions, indent=2, ensure_ascii=False)
    if args.file in (None, STDIO):
        return Value(definitions, text)
    try:
        # Replaced whole (temp file, fsync, rename): a failed export keeps the old one.
        write_file_atomic(args.file, (text + "\n").encode(), fsync_dir=True)
    except OSError as exc:
        raise CtlError(f"cannot write {args.file}: {exc.strerror}") from None
    return Done(f"Exported definitions to {args.file}.")


def import_definitions(client: ApiClient, args: argparse.Namespace) -> Result:
    data = _read_definitions(args.file)
    try:
        definitions = json.loads(data)
    except ValueError as exc:
        raise CtlError(f"{args.file} is not JSON: {exc}") from None
    if not isinstance(definitions, dict):
        raise CtlError(f"{args.file} is not a definitions object")
    client.request("POST", _definitions_path(args), raw_body=data)
    return Done(f"Imported definitions from {args.file}.")


def _read_definitions(file: str) -> bytes:
    try:
        if file == STDIO:
            data = sys.stdin.buffer.read(DEFINITIONS_BYTES_MAX + 1)
        else:
            with open(file, "rb") as source:
                data = source.read(DEFINITIONS_BYTES_MAX + 1)
    except OSError as exc:
        raise CtlError(f"cannot read {file}: {exc.strerror}") from None
    if len(data) > DEFINITIONS_BYTES_MAX:
        raise CtlError(f"{file} is larger than {DEFINITIONS_BYTES_MAX} bytes")
    return data


# Status.


def status(client: ApiClient, args: argparse.Namespace) -> Result:
    """The overview's totals, then the node's uptime, memory, disk and alarms when the user
    may see nodes (RabbitMQ: the monitoring tag)."""
    overview = client.get_object(path("overview"))
    values: dict[str, JsonValue] = {}
    for label, keys in STATUS_FIELDS:
        value: JsonValue = overview
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            values[label] = value
    listeners = overview.get("listeners")
    if isinstance(listeners, list):
        values["listeners"] = [_listener(entry) for entry in listeners if isinstance(entry, dict)]
    try:
        nodes = client.get_list(path("nodes"))
    except CtlError as exc:
        if exc.status not in (401, 403):
            raise
        nodes = []
    if nodes:
        values.update(node_fields(nodes[0]))
    return Fields(values)


def _listener(entry: dict[str, JsonValue]) -> str:
    return f"{entry.get('protocol')} {entry.get('ip_address')}:{entry.get('port')}"


def node_fields(found: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """Uptime in seconds, memory and free disk in bytes, and the raised alarms."""
    fields: dict[str, JsonValue] = {}
    uptime_ms = found.get("uptime")
    if isinstance(uptime_ms, int):
        fields["uptime_s"] = uptime_ms // 1000
    for label, key in (("memory_used_bytes", "mem_used"), ("disk_free_bytes", "disk_free")):
        if isinstance(found.get(key), int):
            fields[label] = found[key]
    fields["alarms"] = [
        alarm
        for alarm, key in (("memory", "mem_alarm"), ("disk", "disk_free_alarm"))
        if found.get(key)
    ]
    return fields


# Cluster status.


def cluster_status(client: ApiClient, args: argparse.Namespace) -> Result:
    """Every node from /api/nodes (LavinMQ's cluster_status verb): name, role, whether it
    is an in-sync replica, its state and how far it lags the leader."""
    rows = [_cluster_row(found) for found in client.get_list(path("nodes"))]
    return Table(CLUSTER_COLUMNS, rows)


def _cluster_row(found: dict[str, JsonValue]) -> dict[str, JsonValue]:
    role = found.get("cluster_role")
    if role is None:
        return {"name": found.get("name"), "role": STANDALONE_ROLE, "state": "serving"}
    return {
        "name": found.get("name"),
        "role": role,
        "in_isr": found.get("in_isr"),
        "state": found.get("state"),
        "lag_bytes": found.get("replication_lag_bytes"),
        "lag_s": found.get("replication_lag_seconds"),
    }
