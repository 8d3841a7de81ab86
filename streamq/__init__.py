"""streamq: a streaming-first AMQP 0-9-1 message broker over an append-only segment log."""

__version__ = "0.1.0"
