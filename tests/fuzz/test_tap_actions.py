"""Fuzz the replication stream's action decoder and applier (streamq/log/tap.py,
`ActionApplier.feed`): what a follower applies to its data directory as the leader sends
it. A peer reaches it once it has authenticated with the cluster's shared secret (and,
while the replication link is clear text, whoever sits on the path between the nodes).

An input is `split | bytes`: the bytes go to an applier rooted in a fresh directory, in
reads of `split` bytes (0: one read). The property: ActionError (a broken stream) and
OSError (what the file system refuses: a name too long, a directory where a file is)
are the only exceptions; nothing is created outside the root (the root's parent holds
the root alone afterwards, and no symlink is made); an incomplete action held for the
next read stays within one action's limits (path, rename target, ACTION_DATA_BYTES_MAX).

Run: pytest tests/fuzz/test_tap_actions.py (bounded), or
python -m tests.fuzz.soak tap_actions -runs=1000000 (atheris soak, tools/fuzz.sh).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Final

from streamq.log.tap import ACTION_DATA_BYTES_MAX, PATH_BYTES_MAX, ActionApplier, ActionError
from tests.fuzz.broker_host import scratch
from tests.fuzz.harness import bounded_run

CORPUS: Final = "tap"
EXAMPLES: Final = 2400
# The head (kind, path length), the path, a WRITE's position and length or a RENAME's
# target, and a WRITE's data: the most an incomplete action may hold.
PENDING_BYTES_MAX: Final = 3 + PATH_BYTES_MAX + 12 + PATH_BYTES_MAX + ACTION_DATA_BYTES_MAX
_PARENT: Final = tempfile.mkdtemp(prefix="streamq-fuzz-tap-", dir=scratch())
atexit.register(shutil.rmtree, _PARENT, ignore_errors=True)
_ROOT: Final = os.path.join(_PARENT, "root")


def check_and_clear(directory: str = _ROOT) -> None:
    """Assert that no symlink was made under `directory` and remove what is there, in one
    walk (scandir's entries know their type: no stat per name; a walk to check and
    rmtree's own to remove were a third of each input's time)."""
    with os.scandir(directory) as entries:
        for entry in entries:
            assert not entry.is_symlink(), entry.path
            if entry.is_dir(follow_symlinks=False):
                check_and_clear(entry.path)
                os.rmdir(entry.path)
            else:
                os.unlink(entry.path)


def fuzz_one(data: bytes) -> None:
    if not data:
        return
    split, body = data[0], data[1:]
    shutil.rmtree(_ROOT, ignore_errors=True)  # empty, unless the last input failed
    applier = ActionApplier(_ROOT)
    reads = [body] if split == 0 else [body[i : i + split] for i in range(0, len(body), split)]
    try:
        for read in reads:
            applier.feed(read)
            assert len(applier._pending) <= PENDING_BYTES_MAX  # the limit under test
    except (ActionError, OSError) as exc:
        assert str(exc), "a refusal says why"
    finally:
        applier.close()
    assert os.listdir(_PARENT) == ["root"], os.listdir(_PARENT)
    assert not os.path.islink(_ROOT)
    check_and_clear()


def test_tap_actions_bounded() -> None:
    bounded_run(fuzz_one, CORPUS, EXAMPLES)
