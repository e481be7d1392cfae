#!/usr/bin/env bash
# Flash-decoding on a GPU (issue 16) in one call of at most ten minutes:
#
#   bash benchmarks/gpu_decode.sh [splits]   the machine, the decode GPU tests, the decode table
#                                            (choose_num_splits), and with `splits` the
#                                            split-count experiment (benchmarks.decode_splits)
#
# Logs land in $OUT (default benchmarks/out); the decode table is appended to $OUT/RESULTS.md.
# DECODE_ARGS passes options to the table, e.g. DECODE_ARGS="--page-size 64" for the pages on
# which the few-sequence default takes 64-token tiles (docs/journal.md, "64-token tiles inside large
# pages").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem \
        --format=csv
    $PY -c 'import platform, torch, triton; print("python", platform.python_version(), "torch",
        torch.__version__, "triton", triton.__version__, "cuDNN", torch.backends.cudnn.version())'
} 2>&1 | tee "$OUT/env.txt"
workers=$($PY -c 'import xdist' 2>/dev/null && echo "-n 8")
timeout 150 $PY -m pytest -q -p no:cacheprovider $workers -rs tests/kernels/test_triton_decode.py \
    tests/checks/test_checks_flash_decoding.py 2>&1 | tail -5 | tee "$OUT/tests.txt"
rc=${PIPESTATUS[0]}
timeout 240 $PY -m benchmarks.decode --graphs --record --results "$OUT/RESULTS.md" \
    ${DECODE_ARGS:-} > "$OUT/decode.txt" 2>&1 || rc=1
tail -40 "$OUT/decode.txt"
if [ "${1:-}" = splits ]; then
    timeout 300 $PY -m benchmarks.decode_splits > "$OUT/splits.txt" 2>&1 || rc=1
    grep -A200 "^device copy" "$OUT/splits.txt" || tail -20 "$OUT/splits.txt"
fi
exit $rc
