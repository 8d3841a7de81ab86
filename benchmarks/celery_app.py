"""The Celery application that `benchmarks/celery_tasks.py` and
tests/integration/test_celery.py run: its settings and its three tasks.

A worker started as `python -m celery -A benchmarks.celery_app worker` reads its broker
URL, queue and prefetch multiplier from the environment (`BROKER_ENV`, `QUEUE_ENV`,
`PREFETCH_ENV`), so the one module serves every broker and run. The settings are the ones
a careful Celery user picks for work that must not be lost: `task_acks_late` (the ack
after the task ran, so a killed worker's tasks are delivered again), a prefetch
multiplier, `rpc://` results (sent back over AMQP to the caller's reply queue) and
retries that go back through the broker.
"""

from __future__ import annotations

import os
import time
from typing import Any, Final

from celery import Celery, Task

BROKER_ENV: Final = "STREAMQ_CELERY_BROKER"
QUEUE_ENV: Final = "STREAMQ_CELERY_QUEUE"
PREFETCH_ENV: Final = "STREAMQ_CELERY_PREFETCH"
DEFAULT_BROKER: Final = "amqp://guest:guest@127.0.0.1:5672//"
DEFAULT_QUEUE: Final = "celery"
DEFAULT_PREFETCH: Final = 4
RETRIES_MAX: Final = 3
"""A `flaky_add` that asks for more failures than this ends in an error."""

ADD: Final = "streamq_bench.add"
FLAKY_ADD: Final = "streamq_bench.flaky_add"
SLOW_ADD: Final = "streamq_bench.slow_add"


def make_app(broker_url: str, queue: str, prefetch_multiplier: int = DEFAULT_PREFETCH) -> Celery:
    """A Celery application on `broker_url` whose tasks go to `queue`, with the three
    tasks registered under the names above (callers send them by name)."""
    celery = Celery("streamq_bench", broker=broker_url, backend="rpc://")
    celery.conf.update(
        task_acks_late=True,
        # A task whose worker process dies (prefork) goes back to the queue, not to an error.
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=prefetch_multiplier,
        task_default_queue=queue,
        result_persistent=False,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    celery.task(name=ADD)(add)
    celery.task(name=FLAKY_ADD, bind=True, max_retries=RETRIES_MAX, default_retry_delay=0)(
        flaky_add
    )
    celery.task(name=SLOW_ADD, bind=True)(slow_add)
    return celery


def add(x: int, y: int) -> int:
    return x + y


def flaky_add(self: Task[Any, Any], x: int, y: int, failures: int) -> int:
    """`x + y` after failing `failures` times: each failure is a retry published back to
    the queue through the broker (countdown 0)."""
    if self.request.retries < failures:
        raise self.retry(countdown=0)
    return x + y


def slow_add(self: Task[Any, Any], x: int, y: int, seconds: float) -> list[Any]:
    """`[x + y, redelivered]` after sleeping `seconds`: whether the broker delivered this
    task before (to a worker that died before its late ack)."""
    time.sleep(seconds)
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    return [x + y, redelivered]


app = make_app(
    os.environ.get(BROKER_ENV, DEFAULT_BROKER),
    os.environ.get(QUEUE_ENV, DEFAULT_QUEUE),
    int(os.environ.get(PREFETCH_ENV, str(DEFAULT_PREFETCH))),
)
"""The worker's application: `python -m celery -A benchmarks.celery_app worker`."""
