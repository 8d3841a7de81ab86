"""Progress lines for long work: counts done of the total, the rate and an ETA.

Owns `Progress`, the reporter that a long loop (a log's recovery, a definitions import,
a cluster follower's full sync, a data directory migration) steps once per item: it
logs `WHAT: DONE of TOTAL UNIT (P%), R UNIT/s, ETA 1m05s` at most once per interval
(`set_interval_s`, from `[main] log_progress_interval`), and a last line when the work
ends. Work that ends within one interval logs that last line at debug only, so a
start-up over a small data directory stays quiet. Each line also carries the numbers as
the structured field `progress` (`done`, `total`, `unit`, `elapsed_s`, `eta_s`), for
the JSON log.

A step costs one clock read and a compare. It logs and nothing else: it must not know
what the work is, and it never sleeps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

INTERVAL_S_DEFAULT: Final = 10.0
_interval_s = INTERVAL_S_DEFAULT


def set_interval_s(seconds: float) -> None:
    """Log progress at most once per `seconds` (0: at every step); for the process."""
    global _interval_s  # noqa: PLW0603 - one setting of the process, as logging's level
    if seconds < 0:
        raise ValueError(f"a progress interval is not negative: {seconds}")
    _interval_s = seconds


def interval_s() -> float:
    return _interval_s


def duration_text(seconds: float) -> str:
    """`42s`, `3m07s`, `2h05m`."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


class Progress:
    """Progress of `total` items of `unit` (plural: "segments") in the work `what`."""

    __slots__ = (
        "_clock",
        "_fields",
        "_last_s",
        "_logger",
        "_reported",
        "_start_s",
        "done",
        "total",
        "unit",
        "what",
    )

    def __init__(
        self,
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
        what: str,
        total: int,
        unit: str,
        *,
        fields: dict[str, object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self.what = what
        self.total = total
        self.unit = unit
        self.done = 0
        self._fields = fields or {}
        self._clock = clock
        self._start_s = self._last_s = clock()
        self._reported = False

    def step(self, count: int = 1) -> None:
        """`count` more items done; logs a line if the interval has passed since the last."""
        self.done += count
        now = self._clock()
        if now - self._last_s >= _interval_s:
            self._last_s = now
            self._reported = True
            self._log(logging.INFO, self._progress_text(now), now)

    def finish(self) -> None:
        """The work is over: its last line (at info if a progress line came before)."""
        now = self._clock()
        text = (
            f"{self.what}: {self.done} of {self.total} {self.unit} done in "
            f"{duration_text(now - self._start_s)}"
        )
        self._log(logging.INFO if self._reported else logging.DEBUG, text, now)

    def eta_s(self, now: float) -> float | None:
        """Seconds left at the rate so far; None before any item is done."""
        elapsed = now - self._start_s
        if self.done <= 0 or elapsed <= 0:
            return None
        return max(0, self.total - self.done) * elapsed / self.done

    def _progress_text(self, now: float) -> str:
        elapsed = now - self._start_s
        percent = f" ({100 * self.done // self.total}%)" if self.total > 0 else ""
        rate = f", {self.done / elapsed:.1f} {self.unit}/s" if elapsed > 0 else ""
        eta = self.eta_s(now)
        left = f", ETA {duration_text(eta)}" if eta is not None else ""
        return f"{self.what}: {self.done} of {self.total} {self.unit}{percent}{rate}{left}"

    def _log(self, level: int, text: str, now: float) -> None:
        eta = self.eta_s(now)
        numbers: dict[str, object] = {
            "done": self.done,
            "total": self.total,
            "unit": self.unit,
            "elapsed_s": round(now - self._start_s, 3),
            "eta_s": None if eta is None else round(eta, 3),
        }
        self._logger.log(level, "%s", text, extra={**self._fields, "progress": numbers})
