"""Links between brokers: shovels and federation, and the AMQP client they speak through.

This optional layer sits above the gateways and the broker core (pyproject.toml's
import-linter contract): it may import `amqp_gateway` (its codec, and the gateway for
direct local connections), `streamq.broker` and below, while nothing below imports it.
The management API sees what runs here only through `Broker.links`, as it sees AMQP
connections through `Broker.clients`.
"""
