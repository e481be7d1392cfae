#!/usr/bin/env bash
# The learner track and the capstone on a GPU (issue 15), in two calls of at most ten minutes:
#
#   bash benchmarks/gpu_capstone.sh tests   # the machine, the GPU tests of the learner track's
#                                           # checks and the capstone, notebook 11 run whole
#   bash benchmarks/gpu_capstone.sh bench   # forward and backward: course, learner, SDPA;
#                                           # then the capstone's throughput and memory table
#
# Logs and the markdown tables land in $OUT (default benchmarks/out).
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
rc=0
case "${1:-}" in
tests)
    workers=$($PY -c 'import xdist' 2>/dev/null && echo "-n 8")
    timeout 420 $PY -m pytest -q -p no:cacheprovider $workers -rs tests/references/test_gpt.py \
        tests/benchmarks/test_benchmark_learner.py tests/checks/test_checks_capstone.py \
        tests/benchmarks/test_learner_solutions.py \
        tests/checks/test_checks_triton_forward_kernel.py tests/checks/test_checks_triton_forward_puzzles.py \
        tests/checks/test_checks_triton_backward.py tests/checks/test_checks_flash_decoding.py \
        tests/kernels/test_triton_forward.py \
        2>&1 | tee "$OUT/tests.txt" | tail -40
    rc=$((rc || PIPESTATUS[0]))
    timeout 300 $PY -m benchmarks.run_notebook solutions/11_capstone/11_capstone.ipynb \
        2>&1 | tee "$OUT/notebook11.txt" | tail -60
    rc=$((rc || PIPESTATUS[0]))
    ;;
bench)
    $PY -m benchmarks.attention --learner benchmarks.learner_solutions:attention_fwd \
        --out "$OUT/fwd" --no-append 2>&1 | tee "$OUT/fwd.txt" | tail -30
    rc=$((rc || PIPESTATUS[0]))
    $PY -m benchmarks.attention --backward --out "$OUT/bwd" --no-append \
        --learner-backward benchmarks.learner_solutions:LearnerTrack 2>&1 | tee "$OUT/bwd.txt" | tail -30
    rc=$((rc || PIPESTATUS[0]))
    $PY -m benchmarks.capstone --out "$OUT/capstone" --no-append 2>&1 | tee "$OUT/capstone.txt" | tail -40
    rc=$((rc || PIPESTATUS[0]))
    ;;
*) echo "usage: bash benchmarks/gpu_capstone.sh tests|bench" >&2; exit 2 ;;
esac
echo "== exit status $rc"
exit $rc
