#!/bin/sh
# The `make fuzz` soak (docs/fuzzing.md): build the C modules with AddressSanitizer and
# UndefinedBehaviorSanitizer in a copy of the working tree (as tools/sanitize.sh does),
# then run each fuzz module of tests/fuzz under atheris for RUNS inputs, one at a time and
# at the lowest CPU priority. The runtime is atheris' own ASan build with libFuzzer
# inside (asan_with_fuzzer.so, preloaded; it has the UBSan handlers too): gcc's libasan
# would take over libFuzzer's coverage hooks and blind the fuzzer, so the modules are
# compiled with gcc's sanitizer instrumentation but linked without its runtime. Usage:
#   tools/fuzz.sh [NAME...]      NAME: amqp_frames, stream_protocol, ... (default: all)
# RUNS (default 1000000) is the inputs per module; FUZZ_SECONDS, if set, stops a module
# after that many seconds instead (libFuzzer's -max_total_time; the count is reported); FUZZ_ARTIFACTS where failing inputs
# are written (default $TMPDIR/streamq-fuzz-artifacts); FUZZ_LOG a file that gets each
# module's count and time; FUZZ_LOG_DIR a directory that keeps each module's libFuzzer log
# (<name>.log; by default it goes with the working copy); FUZZ_NICE the nice increment of
# the fuzzing process (default 19, the lowest priority; FUZZ_NICE=0 keeps the caller's:
# `FUZZ_NICE=0 nice -n 10 tools/fuzz.sh` runs at 10, without it at 19).
# FUZZ_WAIT_SCALE (default 10) multiplies the fuzzers' wall-clock bounds, libFuzzer's
# per-input -timeout among them (1: as in `make test`). FUZZ_GROUP_NICE, if set, runs each
# module in a session of its own and gives that session's CPU group (Linux autogroup,
# /proc/PID/autogroup) this nice value: with autogroup scheduling each session shares the
# CPU as one group and `nice` orders processes only inside their group, so a soak that
# must yield to other sessions' work needs FUZZ_GROUP_NICE=19 (a negative value, which
# needs CAP_SYS_NICE, makes it the others' better). In a session of its own the module
# does not get the terminal's Ctrl-C: stop it by its pid.
# Exit status: 0 if every module ran its inputs clean.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
runs=${RUNS:-1000000}
time_limit=${FUZZ_SECONDS:+-max_total_time=$FUZZ_SECONDS}
work=$(mktemp -d "${TMPDIR:-/tmp}/streamq-fuzz.XXXXXX")
# The inputs' brokers and directories (tests/fuzz/broker_host.py): in memory if we can.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    scratch=$(mktemp -d /dev/shm/streamq-fuzz.XXXXXX)
else
    scratch="$work/scratch"
    mkdir "$scratch"
fi
export STREAMQ_FUZZ_SCRATCH="$scratch"
# The fuzzers' wall-clock bounds (tests/fuzz/harness.py WAIT_SCALE), ten times longer by
# default: at the lowest CPU priority beside other work a process waits for a core.
export STREAMQ_FUZZ_WAIT_SCALE="${FUZZ_WAIT_SCALE:-10}"
# Failing inputs outlive the run: not under $work, which goes at exit (the modules run
# with TMPDIR=$work, where tests/fuzz/harness.py would put them by default).
export FUZZ_ARTIFACTS="${FUZZ_ARTIFACTS:-${TMPDIR:-/tmp}/streamq-fuzz-artifacts}"
# On INT or TERM the script ends (a trap that only removed the copies let the loop go on
# to the next module without them); the EXIT trap removes them.
trap 'rm -rf "$work" "$scratch"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - 2>/dev/null) \
    | tar -xf - -C "$work"
cd "$work"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1"
find amqp_gateway streamq -name '*.so' -delete
if ! CC="gcc $flags" LDSHARED="gcc -shared" "$python" setup.py build_ext --inplace \
    >build.log 2>&1; then
    cat build.log >&2
    exit 1
fi
if [ $# -eq 0 ]; then
    set -- $(cd tests/fuzz && ls test_*.py | sed 's/^test_//; s/\.py$//')
fi
preload="$("$python" -c 'import atheris; print(atheris.path())')/asan_with_fuzzer.so"
# Runs its arguments, in a session of its own with FUZZ_GROUP_NICE (above); a weight that
# cannot be set (no autogroup, or no privilege for a negative one) is left as it is.
in_group() {
    if [ -n "${FUZZ_GROUP_NICE:-}" ]; then
        setsid sh -c 'echo "$0" >/proc/self/autogroup 2>/dev/null; exec "$@"' \
            "$FUZZ_GROUP_NICE" "$@"
    else
        "$@"
    fi
}
logs=${FUZZ_LOG_DIR:-$work}
mkdir -p "$logs"
status=0
for name in "$@"; do
    start=$(date +%s)
    # Leak checking is off: CPython keeps its interned objects and arenas to the end.
    # No allocation stacks and a small quarantine: with them the interpreter's mallocs
    # make the runtime's stack depot grow past a GB and run 7 times slower; an error is
    # still caught, and a failing input is rerun with full stacks (docs/fuzzing.md).
    asan=detect_leaks=0:abort_on_error=1:malloc_context_size=0:quarantine_size_mb=16
    if in_group env LD_PRELOAD="$preload" ASAN_OPTIONS="${FUZZ_ASAN_OPTIONS:-$asan}" \
        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 PYTHONPATH="$work" TMPDIR="$work" \
        nice -n "${FUZZ_NICE:-19}" "$python" -m tests.fuzz.soak "$name" -runs="$runs" $time_limit -print_final_stats=1 \
        >"$logs/$name.log" 2>&1; then
        result=ok
    else
        result=FAILED
        status=1
    fi
    done_runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$logs/$name.log" | tail -1)
    line="$name: $result, ${done_runs:-?} inputs in $(($(date +%s) - start)) s"
    echo "$line"
    if [ -n "${FUZZ_LOG:-}" ]; then
        echo "$(date -u +%FT%TZ) $line" >>"$FUZZ_LOG"
    fi
    if [ "$result" = FAILED ]; then
        tail -40 "$logs/$name.log" >&2
    fi
done
exit $status
