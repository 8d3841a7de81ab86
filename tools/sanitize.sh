#!/bin/sh
# Build the C modules (setup.py) with AddressSanitizer and UndefinedBehaviorSanitizer in a
# copy of the working tree, then run their tests there with the sanitizer runtimes
# preloaded into the (uninstrumented) interpreter: any error aborts the run (STYLE.md
# section 11). Usage: tools/sanitize.sh [pytest arguments]; PYTHON names the interpreter
# (default: the repository's .venv). Exit status: pytest's, or 1 for a failed build.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
work=$(mktemp -d "${TMPDIR:-/tmp}/streamq-sanitize.XXXXXX")
trap 'rm -rf "$work"' EXIT  # INT and TERM end the script (below), then this runs
trap 'exit 130' INT
trap 'exit 143' TERM
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - 2>/dev/null) \
    | tar -xf - -C "$work"
cd "$work"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1"
if ! CFLAGS="$flags" LDFLAGS="-fsanitize=address,undefined" "$python" setup.py build_ext --inplace \
    >build.log 2>&1; then
    cat build.log >&2
    exit 1
fi
preload="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
if [ $# -eq 0 ]; then
    set -- tests/unit/amqp_gateway/test_deliver_c.py tests/unit/amqp_gateway/test_deliver_records_c.py \
        tests/unit/amqp_gateway/test_deliver_stream_c.py tests/unit/amqp_gateway/test_scan.py \
        tests/unit/amqp_gateway/test_scan_acks.py tests/unit/log/test_records_c.py \
        tests/unit/log/test_check_records_c.py tests/unit/log/test_format_crc_chain.py \
        tests/unit/log/test_streamwire_c.py tests/unit/queues/test_stream_native.py \
        tests/unit/broker/test_vhost.py tests/unit/log/test_damage.py \
        tests/unit/log/test_amqp10_c.py tests/unit/spark_source/test_native_columns.py \
        tests/unit/amqp_gateway/test_deliver_stream_native_c.py \
        tests/unit/log/test_chunk_run_c.py tests/unit/log/test_log_chunk_runs.py \
        tests/unit/queues/test_converted_entries_c.py tests/unit/queues/test_converted_run.py \
        tests/unit/spark_source/test_chunk_spans.py
fi
# Leak checking is off: CPython keeps its interned objects and arenas to the end.
LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 PYTHONPATH="$work" \
    "$python" -m pytest -q -p no:cacheprovider -p no:randomly "$@"
