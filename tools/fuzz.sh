#!/bin/sh
# The `make fuzz` soak (docs/fuzzing.md): build the C modules with AddressSanitizer and
# UndefinedBehaviorSanitizer in a copy of the working tree (as tools/sanitize.sh does),
# then run each fuzz module of tests/fuzz under atheris for RUNS inputs, one at a time and
# at the lowest CPU priority, with the sanitizer runtimes preloaded. Usage:
#   tools/fuzz.sh [NAME...]      NAME: amqp_frames, stream_protocol, ... (default: all)
# RUNS (default 1000000) is the inputs per module; FUZZ_ARTIFACTS where failing inputs
# are written (default $TMPDIR/streamq-fuzz-artifacts); FUZZ_LOG a file that gets each
# module's count and time. Exit status: 0 if every module ran its inputs clean.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
runs=${RUNS:-1000000}
work=$(mktemp -d "${TMPDIR:-/tmp}/streamq-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - 2>/dev/null) \
    | tar -xf - -C "$work"
cd "$work"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1"
if ! CFLAGS="$flags" LDFLAGS="-fsanitize=address,undefined" "$python" setup.py build_ext --inplace \
    >build.log 2>&1; then
    cat build.log >&2
    exit 1
fi
if [ $# -eq 0 ]; then
    set -- $(cd tests/fuzz && ls test_*.py | sed 's/^test_//; s/\.py$//')
fi
preload="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
status=0
for name in "$@"; do
    start=$(date +%s)
    # Leak checking is off: CPython keeps its interned objects and arenas to the end.
    if LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 PYTHONPATH="$work" TMPDIR="$work" \
        nice -n 19 "$python" -m tests.fuzz.soak "$name" -runs="$runs" -print_final_stats=1 \
        >"$work/$name.log" 2>&1; then
        result=ok
    else
        result=FAILED
        status=1
    fi
    done_runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$work/$name.log" | tail -1)
    line="$name: $result, ${done_runs:-?} inputs in $(($(date +%s) - start)) s"
    echo "$line"
    if [ -n "${FUZZ_LOG:-}" ]; then
        echo "$(date -u +%FT%TZ) $line" >>"$FUZZ_LOG"
    fi
    if [ "$result" = FAILED ]; then
        tail -40 "$work/$name.log" >&2
    fi
done
exit $status
