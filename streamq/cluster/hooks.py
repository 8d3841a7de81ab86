"""The `on_leader_elected` and `on_leader_lost` hooks (LavinMQ's): operators' shell
commands run when this node becomes or stops being the leader.

Owns running one: `sh -c COMMAND` with `STREAMQ_NODE_ID` and `STREAMQ_LEADER_URI` (this
node's advertised replication URI) added to the environment, in its own process group,
killed (that group, by its id) if it runs longer than HOOK_TIMEOUT_S. It never blocks the
node: `Hooks.run` starts it on a task of its own and returns; its exit status and the end
of its output are logged. `Hooks.close` waits (bounded) for hooks still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Final

logger = logging.getLogger(__name__)

HOOK_TIMEOUT_S: Final = 30.0
OUTPUT_BYTES_MAX: Final = 4096  # of a hook's output, what the log line shows
CLOSE_TIMEOUT_S: Final = 5.0


class Hooks:
    def __init__(self, node_id: str, leader_uri: str, *, timeout_s: float = HOOK_TIMEOUT_S):
        self.node_id = node_id
        self.leader_uri = leader_uri
        self.timeout_s = timeout_s
        self._running: set[asyncio.Task[None]] = set()

    def run(self, name: str, command: str) -> None:
        """Start hook `name` ("on_leader_elected") running `command`; "" runs nothing."""
        if not command:
            return
        task = asyncio.get_running_loop().create_task(self._run(name, command))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, name: str, command: str) -> None:
        env = dict(os.environ, STREAMQ_NODE_ID=self.node_id, STREAMQ_LEADER_URI=self.leader_uri)
        try:
            process = await asyncio.create_subprocess_shell(
                command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own group: a timeout kills what it started too
            )
        except OSError as exc:
            logger.warning("clustering: hook %s could not start: %s", name, exc)
            return
        try:
            output, _ = await asyncio.wait_for(process.communicate(), self.timeout_s)
        except TimeoutError:
            _kill_group(process.pid)
            await process.wait()
            logger.warning("clustering: hook %s killed after %g s", name, self.timeout_s)
            return
        finally:
            if process.returncode is None:  # cancelled: do not leave it behind
                _kill_group(process.pid)
        text = output[-OUTPUT_BYTES_MAX:].decode(errors="replace").strip()
        level = logging.INFO if process.returncode == 0 else logging.WARNING
        logger.log(level, "clustering: hook %s exited %s%s", name, process.returncode,
                   f": {text}" if text else "")  # fmt: skip

    async def close(self) -> None:
        """Wait for running hooks, at most CLOSE_TIMEOUT_S; then they are killed."""
        if not self._running:
            return
        _, pending = await asyncio.wait(set(self._running), timeout=CLOSE_TIMEOUT_S)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _kill_group(pid: int) -> None:
    # The group id is the hook's own pid (start_new_session): only what it started.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
