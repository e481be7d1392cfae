#!/usr/bin/env bash
# Everything the GPU is needed for, in one call: the machine and versions, the kernels' GPU tests
# (forward, backward, decode, Hopper), the checks of the Triton notebooks (06, 08, 09, 11) with the
# learners' kernels compiled for the GPU, then the benchmark (extra arguments go to `python -m benchmarks.attention`,
# e.g. --backward or --sweep). Logs, the plot, the JSON and the RESULTS.md section land in $OUT
# (default benchmarks/out).
#
#   bash benchmarks/gpu_check.sh [--backward] [--sweep] [--learner module:function]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

{
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem \
        --format=csv
    $PY -c 'import platform, torch, triton; print("python", platform.python_version(), "torch",
        torch.__version__, "triton", triton.__version__, "cuDNN", torch.backends.cudnn.version(),
        "capability", torch.cuda.get_device_capability())'
} 2>&1 | tee "$OUT/env.txt"

echo "== GPU tests"
# Several workers: most of the time is Triton compiling kernels, on the CPU.
workers=$($PY -c 'import xdist' 2>/dev/null && echo "-n 8")
timeout 150 $PY -m pytest -q -m gpu -p no:cacheprovider $workers tests/kernels 2>&1 |
    tee "$OUT/gpu_tests.txt"
tests_rc=${PIPESTATUS[0]}
timeout 280 $PY -m pytest -q -p no:cacheprovider $workers -rs tests/checks/test_checks_triton_forward_kernel.py \
    tests/checks/test_checks_triton_forward_puzzles.py tests/checks/test_checks_triton_backward.py \
    tests/checks/test_checks_flash_decoding.py tests/checks/test_checks_capstone.py 2>&1 |
    tee "$OUT/gpu_checks.txt"
tests_rc=$((tests_rc || PIPESTATUS[0]))

echo "== benchmark"
plot="$OUT/attention_fwd.png"
for arg in "$@"; do [ "$arg" = --backward ] && plot="$OUT/attention_bwd.png"; done
$PY -m benchmarks.attention --out "$OUT" --plot "$plot" --no-append "$@" 2>&1 | tee "$OUT/bench.txt"
bench_rc=${PIPESTATUS[0]}

echo "== exit codes: tests $tests_rc, benchmark $bench_rc"
exit $((tests_rc || bench_rc))
