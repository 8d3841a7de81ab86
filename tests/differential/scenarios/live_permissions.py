"""Changes to users, vhosts and permissions while a connection is open: what its next
operations meet. streamq applies every change to open connections (LavinMQ 2.6's fix);
RabbitMQ 3.10 caches allowed answers per channel, so only the same channel after a
revocation differs (allowlist.py)."""

from __future__ import annotations

from amqp_gateway.codec import methods as m
from tests.differential.harness import Conn, Session, scenario

V = "%2F"  # the default vhost "/" in a path
EVERYTHING = {"configure": ".*", "write": ".*", "read": ".*"}
REVOKED = "write revoked"  # the record the allow-list cuts at


def status(s: Session, method: str, path: str, body: object = None) -> None:
    code, _ = s.http(method, path, body)
    s.record(method, path, code)


def user_on(s: Session, vhost_path: str = V) -> tuple[str, Conn]:
    """A new user (its password is its name) with every permission on the vhost, and a
    connection of it there with channel 1 open."""
    user = s.name("user")
    status(s, "PUT", f"/api/users/{user}", {"password": user, "tags": ""})
    status(s, "PUT", f"/api/permissions/{vhost_path}/{user}", EVERYTHING)
    vhost = "/" if vhost_path == V else vhost_path
    c = s.connect(vhost=vhost, user=user, password=user)
    c.open(1)
    return user, c


def revoke_write(s: Session, user: str) -> None:
    status(s, "PUT", f"/api/permissions/{V}/{user}", {**EVERYTHING, "write": ""})


@scenario("permissions: a new channel of an open connection meets a revoked write")
def _new_channel(s: Session) -> None:
    user, c = user_on(s)
    q = s.name()
    c.call(1, m.QueueDeclare(queue=q))
    c.publish(1, "", q)
    c.sync(1)
    revoke_write(s, user)
    c.open(2)
    c.publish(2, "", q)  # 403 on both
    c.sync(2)
    c.open(3)
    c.call(3, m.QueueDeclare(queue=q, passive=True))  # the connection stays, 1 message


@scenario("permissions: the same channel after its write is revoked")
def _same_channel(s: Session) -> None:
    user, c = user_on(s)
    q = s.name()
    c.call(1, m.QueueDeclare(queue=q))
    c.publish(1, "", q)
    c.sync(1)
    revoke_write(s, user)
    s.record(REVOKED)
    c.publish(1, "", q)  # streamq: 403; RabbitMQ 3.10: stored (its channel's cache)
    c.sync(1)


@scenario("permissions: cleared on an open connection")
def _cleared(s: Session) -> None:
    user, c = user_on(s)
    status(s, "DELETE", f"/api/permissions/{V}/{user}")
    c.open(2)
    c.call(2, m.QueueDeclare(queue=s.name()))  # 403 on both
    c.open(3)  # the connection stays open
    s.connect(user=user, password=user)  # a new one is refused at connection.open


@scenario("users: deleting a user closes its connections")
def _user_deleted(s: Session) -> None:
    user, c = user_on(s)
    status(s, "DELETE", f"/api/users/{user}")
    c.expect(1, "connection.close")


@scenario("users: a password change keeps open connections")
def _password_changed(s: Session) -> None:
    user, c = user_on(s)
    status(s, "PUT", f"/api/users/{user}", {"password": "changed", "tags": ""})
    q = s.name()
    c.call(1, m.QueueDeclare(queue=q))
    c.publish(1, "", q)
    c.sync(1)
    c.call(1, m.QueueDeclare(queue=q, passive=True))
    s.connect(user=user, password=user)  # the old password is refused


@scenario("vhosts: deleting a vhost closes its connections")
def _vhost_deleted(s: Session) -> None:
    vhost = s.name("vh")
    status(s, "PUT", f"/api/vhosts/{vhost}", {})
    _user, c = user_on(s, vhost)
    status(s, "DELETE", f"/api/vhosts/{vhost}")
    c.expect(1, "connection.close")
