"""What every throughput worker process does around its own loop.

Owns the worker side of the parent protocol: ignore SIGINT (the parent decides when to
stop), report readiness and wait for `go`, and send exactly one message back over the
pipe, `("done", latency_bytes)` or `("error", one_line)`. A worker never prints a
traceback: an unexpected exception is reported as one line too.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Final

from streamq.perf.errors import PerfError
from streamq.perf.shared import Shared

GO_TIMEOUT_S: Final = 30.0
GO_POLL_S: Final = 0.001


def run_worker(work: Callable[[], bytes], pipe: Connection) -> None:
    """Run `work` and report its result (latency samples, maybe empty) on `pipe`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = work()
    except PerfError as exc:
        pipe.send(("error", str(exc)))
    except Exception as exc:  # One line to the parent, as promised, not a traceback.
        pipe.send(("error", f"internal error: {type(exc).__name__}: {exc}"))
    else:
        pipe.send(("done", result))
    finally:
        pipe.close()


def wait_for_go(shared: Shared) -> None:
    """Tell the parent this worker is ready and wait until all are. Raises `PerfError`
    after GO_TIMEOUT_S, or when the parent stops the run before it starts."""
    shared.mark_ready()
    deadline = time.monotonic() + GO_TIMEOUT_S
    while not shared.going():
        if shared.stopping():
            raise PerfError("stopped before the start")
        if time.monotonic() > deadline:
            raise PerfError("timed out waiting for the other workers to connect")
        time.sleep(GO_POLL_S)
