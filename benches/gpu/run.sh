#!/usr/bin/env bash
# The GPU run, in one call: install the carried wheel (dist/*.whl, built with
# `maturin build --release -o dist`), check the Triton kernels (attention, the
# fused norm and RoPE kernels) against torch and time them, with a small
# sweep of decode launch choices, the simulator's fidelity to the engine on
# this GPU, then nano-vllm's benchmark workload through the engine with CUDA
# graphs on and off and through transformers' generate.
# Each part prints a short table last; the last table is the nano bench's.
# Results go to $OUT (or /tmp). `--dry-run` runs the same scripts on the CPU
# at toy sizes (the kernels in Triton's interpreter).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}"
if [[ "${1:-}" == "--dry-run" ]]; then
    export TRITON_INTERPRET=1
    python3 benches/gpu/kernel_bench.py --dry-run --out "$out/kernels-dry.csv"
    python3 benches/gpu/simulate_fidelity.py --dry-run
    exec python3 benches/gpu/nano_bench.py --dry-run
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ironbatch-site dist/ironbatch-*.whl
export PYTHONPATH=/tmp/ironbatch-site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 benches/gpu/kernel_bench.py --out "$out/kernels.csv" 2>&1 | tee "$out/kernels.log"
python3 benches/gpu/simulate_fidelity.py 2>&1 | tee "$out/simulate_fidelity.log"
python3 benches/gpu/nano_bench.py 2>&1 | tee "$out/nano.log"
