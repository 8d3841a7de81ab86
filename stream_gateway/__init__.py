"""The RabbitMQ stream protocol gateway (port 5552): codec, then protocol, then server.

Only the sans-IO codec (`stream_gateway.codec`) exists so far; the protocol state machines
and the listener land with the rest of the stream-protocol issue.
"""
