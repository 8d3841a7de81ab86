"""The outbound AMQP 0-9-1 client of shovels and federation links.

Modules: `uri` (RabbitMQ's AMQP URI spec: `amqp[s]://user:pass@host:port/vhost?...`),
`wire` (the sans-IO part: publishes written and deliveries read in whole buffers) and
`client` (the asyncio protocol: handshake, channels, heartbeats, confirms, consumers).
It speaks through the project's codec (`amqp_gateway.codec`); no third-party client runs
inside the broker.
"""
