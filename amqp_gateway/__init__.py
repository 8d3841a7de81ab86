"""The AMQP 0-9-1 gateway (layer L4): sans-IO codec, protocol state machines, asyncio server."""
