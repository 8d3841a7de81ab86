"""RabbitMQ's health checks (`/api/health/checks/...`) as a load balancer or a probe asks
them: the status and the whole body where it names nothing of one broker's own, and
where it does (ports, the list of every listener: RabbitMQ also lists its clustering
port) the fields with the ports masked. Both brokers are healthy here and serve AMQP and
HTTP without TLS; the failing states (alarms, a vhost down, an expiring certificate) are
tested on streamq alone in tests/integration/test_health_checks.py.
"""

from __future__ import annotations

from typing import Any

from tests.differential.harness import Session, scenario

CHECKS = "/api/health/checks"
UNUSED_PORT = 1  # privileged: neither broker listens there


def whole(s: Session, check: str) -> None:
    code, body = s.http("GET", f"{CHECKS}/{check}")
    s.record(check, code, body)


def masked_ports(s: Session, body: Any) -> Any:
    """`body` with this broker's AMQP and HTTP ports named, and the `ports` list
    reduced to whether each of them is in it."""
    if not isinstance(body, dict):
        return body
    names = {s.endpoint.amqp_port: "<amqp>", s.endpoint.http_port: "<http>"}
    out = dict(body)
    for key in ("port", "missing"):
        if key in out:
            out[key] = names.get(out[key], out[key])
    if isinstance(out.get("ports"), list):
        out["ports"] = sorted(names[p] for p in out["ports"] if p in names)
    if isinstance(out.get("protocols"), list):
        out["protocols"] = sorted(p for p in set(out["protocols"]) if p in ("amqp", "http"))
    return out


@scenario("health checks: alarms, virtual hosts and quorum-critical on a healthy node")
def healthy_node(s: Session) -> None:
    assert s.http("PUT", f"/api/vhosts/{s.name('vhost')}")[0] in (201, 204)
    s.cleanups.append(lambda: s.http("DELETE", f"/api/vhosts/{s.name('vhost')}"))
    assert s.http("PUT", f"/api/queues/%2F/{s.name()}", {"durable": True})[0] in (201, 204)
    s.cleanups.append(lambda: s.http("DELETE", f"/api/queues/%2F/{s.name()}"))
    for check in (
        "alarms",
        "local-alarms",
        "virtual-hosts",
        "node-is-quorum-critical",
        "node-is-mirror-sync-critical",
    ):
        whole(s, check)


@scenario("health checks: port-listener for served, unused and malformed ports")
def port_listener(s: Session) -> None:
    for port in (s.endpoint.amqp_port, s.endpoint.http_port, UNUSED_PORT, -1, "+1"):
        code, body = s.http("GET", f"{CHECKS}/port-listener/{port}")
        s.record("port-listener", code, masked_ports(s, body))
    for bad in ("amqp", "1.5", "%201", "5672abc", ""):
        whole(s, f"port-listener/{bad}")


@scenario("health checks: protocol-listener with RabbitMQ's names and aliases")
def protocol_listener(s: Session) -> None:
    for protocol in (
        "amqp",
        "AMQP",
        "amqp091",
        "amqp0-9-1",
        "amqp1.0",
        "http",
        "management",
        "ui",
        "http_api",
        "amqps",
        "https",
        "mqtt",
        "mqtt3.1.1",
        "stomp1.2",
        "web-mqtt%2Bssl",
        "something",
        "",
    ):
        code, body = s.http("GET", f"{CHECKS}/protocol-listener/{protocol}")
        s.record("protocol-listener", protocol, code, masked_ports(s, body))


@scenario("health checks: certificate-expiration with no TLS listener, and bad arguments")
def certificate_expiration(s: Session) -> None:
    for path in (
        "1/days",
        "4/WEEKS",
        "12/months",
        "100/years",
        "-1/days",
        "1/fortnights",
        "1/day",
        "x/days",
        "1.5/days",
        "/days",
        "1/",
        "/",
    ):
        whole(s, f"certificate-expiration/{path}")


@scenario("health checks: methods other than GET, and callers who are not management users")
def refused_callers(s: Session) -> None:
    for method in ("POST", "PUT", "DELETE"):
        code, _ = s.http(method, f"{CHECKS}/alarms")
        s.record(method, code)
    code, _ = s.http("GET", f"{CHECKS}/alarms", user="nobody-at-all")
    s.record("unknown user", code)
