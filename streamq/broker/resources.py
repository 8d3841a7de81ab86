"""Resource alarms: the broker's memory and the data directory's free disk space.

Owns the two limits RabbitMQ calls `vm_memory_high_watermark` and `disk_free_limit` and
the check of both. When either is crossed, the gateway blocks publishing connections
(connection.blocked) until it clears, so that the broker neither runs out of memory nor
fills the disk: nothing already written is put at risk by a publisher that goes on.
It reads `/proc` and `statvfs`; it knows no connections. A log whose writes found the disk
full (however much `statvfs` says is free) raises the disk alarm too, until its writes land.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Final

MIB: Final = 1 << 20
MEMORY_HIGH_WATERMARK_DEFAULT: Final = 0.4  # of physical memory, RabbitMQ's default
# Each vhost's message log keeps its newest writes in memory, for consumers right behind
# the publishers (up to its LogConfig's 32 MiB), at most this share of the watermark: a
# broker given 256 MiB keeps 4 MiB per vhost, one on a 24 GiB host the 32 MiB.
LOG_TAIL_WATERMARK_SHARE: Final = 64
# A few segments' worth (8 MiB each): enough to finish the writes in flight and to
# recover, well before the file system itself refuses.
DISK_FREE_LIMIT_DEFAULT_BYTES: Final = 64 * MIB
_UNITS: Final = {
    "": 1,
    "B": 1,
    "KB": 1000,
    "KIB": 1 << 10,
    "MB": 1000**2,
    "MIB": 1 << 20,
    "GB": 1000**3,
    "GIB": 1 << 30,
    "TB": 1000**4,
    "TIB": 1 << 40,
}
_SIZE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_size(text: str) -> int:
    """`512MiB`, `2GB`, `1048576` as bytes. Raises ValueError with a readable message."""
    match = _SIZE.match(text)
    unit = match[2].upper() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 1048576, 512MiB, 2GB)")
    return int(float(match[1]) * _UNITS[unit])


def parse_memory_limit(text: str) -> int:
    """A fraction of physical memory (`0.4`, as RabbitMQ's relative watermark) or a size."""
    try:
        fraction = float(text)
    except ValueError:
        return parse_size(text)
    if 0 < fraction <= 1:
        return int(fraction * physical_memory_bytes())
    return parse_size(text)


@dataclass(slots=True)
class ResourceLimits:
    memory_high_watermark_bytes: int
    disk_free_limit_bytes: int

    @property
    def log_tail_bytes_max(self) -> int:
        """The bytes of a vhost's newest log writes kept in memory, at most."""
        return self.memory_high_watermark_bytes // LOG_TAIL_WATERMARK_SHARE

    @classmethod
    def defaults(cls) -> ResourceLimits:
        return cls(
            int(MEMORY_HIGH_WATERMARK_DEFAULT * physical_memory_bytes()),
            DISK_FREE_LIMIT_DEFAULT_BYTES,
        )


class _Statm:
    """`/proc/self/statm`, opened once per process and read with `pread`: the open and
    close around each read cost 85-100 us in the running broker, against 5 us for the
    read alone, and the housekeeping reads it five times a second on the event loop."""

    __slots__ = ("fd", "pid")

    def __init__(self) -> None:
        self.fd = -1
        self.pid = -1  # the process that opened `fd`: a forked child opens its own

    def rss_bytes(self) -> int:
        pid = os.getpid()
        if self.pid != pid:
            self.fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
            self.pid = pid
        return int(os.pread(self.fd, 256, 0).split()[1]) * _PAGE_BYTES


_PAGE_BYTES: Final = os.sysconf("SC_PAGE_SIZE")
_statm: Final = _Statm()


def process_memory_bytes() -> int:
    """The broker's resident set size."""
    try:
        return _statm.rss_bytes()
    except (OSError, ValueError, IndexError):
        return 0  # no /proc: the memory alarm cannot fire


def disk_free_bytes(path: str) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


class ResourceMonitor:
    """Checks the limits; `check()` returns the alarm's reason, "" when all is well."""

    def __init__(self, data_dir: str, limits: ResourceLimits) -> None:
        self.data_dir = data_dir
        self.limits = limits  # may be changed at run time; the next check applies them

    def check(self, *, log_out_of_space: bool) -> str:
        """The alarm's reason; `log_out_of_space`: a log's writes wait for disk space."""
        memory = process_memory_bytes() >= self.limits.memory_high_watermark_bytes
        try:
            disk = disk_free_bytes(self.data_dir) < self.limits.disk_free_limit_bytes
        except OSError:
            disk = True  # the data directory cannot be examined: do not write more
        disk = disk or log_out_of_space
        if memory and disk:
            return "low on memory & disk"  # RabbitMQ's reasons, which clients log
        if memory:
            return "low on memory"
        if disk:
            return "low on disk"
        return ""
