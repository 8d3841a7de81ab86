"""The in-memory tail of each vhost's message log is sized from the memory high watermark
(`--memory-high-watermark`): a share of it, never more than the log's configured 32 MiB;
vhosts opened at start and created at run time alike. A refused watermark stops the
start (exit 2, argparse's usage error), as before.

Method: a real Broker on a temporary data directory; the watermark from the `serve`
flags as the command line resolves them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streamq.broker.broker import Broker
from streamq.broker.resources import LOG_TAIL_WATERMARK_SHARE, ResourceLimits
from streamq.cli import build_parser, given_flags, main
from streamq.config import resolve, serve_config

MIB = 1 << 20


def _limits(*argv: str) -> ResourceLimits:
    args = build_parser().parse_args(["serve", *argv])
    limits = serve_config(resolve(given_flags(args), {})).limits
    assert limits is not None
    return limits


@pytest.mark.parametrize(
    ("watermark", "tail_bytes"),
    [("128MiB", 2 * MIB), ("1GiB", 16 * MIB), ("64GiB", 32 * MIB), ("1MiB", MIB // 64)],
)
async def test_the_watermark_sizes_every_vhost_tail(
    tmp_path: Path, watermark: str, tail_bytes: int
) -> None:
    limits = _limits("--memory-high-watermark", watermark)
    assert limits.log_tail_bytes_max == limits.memory_high_watermark_bytes // 64
    broker = Broker(str(tmp_path), limits)
    try:
        assert broker.vhost("/").log.recent_bytes_max == tail_bytes
        created = await broker.create_vhost("other")
        assert created is not None
        assert created.log.recent_bytes_max == tail_bytes
    finally:
        broker.close()


def test_the_default_watermark_keeps_the_logs_own_limit_on_this_host(tmp_path: Path) -> None:
    limits = _limits()  # 0.4 of the RAM
    broker = Broker(str(tmp_path), limits)
    try:
        log = broker.vhost("/").log
        assert log.config.recent_bytes_max == 32 * MIB
        expected = min(32 * MIB, limits.memory_high_watermark_bytes // LOG_TAIL_WATERMARK_SHARE)
        assert log.recent_bytes_max == expected
    finally:
        broker.close()


def test_a_bad_watermark_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--memory-high-watermark", "lots"])
    assert exited.value.code == 2
    assert "not a size" in capsys.readouterr().err
