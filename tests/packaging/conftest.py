"""The sdist and wheel that `make dist` makes, built once per session into a temporary
directory, and a fresh venv with the wheel installed by pip as a user on another machine
would: no compiler reachable, this checkout not on the path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Under load `python -m build` (an isolated build environment, the sdist, the wheel from
# it) has taken 10-20 s and pip's install of the wheel with its dependencies 10-30 s.
DIST_TIMEOUT_S = 240
INSTALL_TIMEOUT_S = 240
# What a build could call to compile: none of them may be reachable by the install.
COMPILERS = ("gcc", "cc", "c99", "clang", "g++", "c++", "x86_64-linux-gnu-gcc")


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path


@dataclass(frozen=True)
class Installed:
    venv: Path
    site_packages: Path
    env: dict[str, str]  # the environment pip ran in: no compiler, no PYTHONPATH

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def run(
    argv: list[str], timeout_s: float, env: dict[str, str] | None = None, cwd: Path | None = None
) -> str:
    """Run `argv` to completion; its stdout, or a failure showing what it printed."""
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=env, cwd=cwd
    )
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """tools/dist.sh with this interpreter, as `make dist` runs it."""
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "PYTHON": sys.executable}
    run([str(REPO / "tools" / "dist.sh"), str(out)], DIST_TIMEOUT_S, env=env)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1, wheels
    assert len(sdists) == 1, sdists
    return Dist(wheels[0], sdists[0])


def no_compiler_env(venv: Path) -> dict[str, str]:
    """The environment of a machine with Python and nothing to build with: PATH is the
    venv's bin alone, and the variables a build would take a compiler from name /bin/false."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    }
    env["PATH"] = str(venv / "bin")
    for name in ("CC", "CXX", "LDSHARED", "CPP"):
        env[name] = "/bin/false"
    for compiler in COMPILERS:
        assert shutil.which(compiler, path=env["PATH"]) is None, compiler
    return env


@pytest.fixture(scope="session")
def installed(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A fresh venv (no system site-packages) with the wheel and its dependencies
    installed by pip. This pip runs the install into the venv (`--python`): ensurepip's
    own pip would cost a few seconds more and install the same files."""
    home = tmp_path_factory.mktemp("installed")
    venv = home / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], INSTALL_TIMEOUT_S)
    env = no_compiler_env(venv)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    install = [*pip, "--python", str(venv / "bin" / "python"), "install", "--quiet"]
    run([*install, str(dist.wheel)], INSTALL_TIMEOUT_S, env=env, cwd=home)
    (site_packages,) = (venv / "lib").glob("python3*/site-packages")
    return Installed(venv, site_packages, env)
