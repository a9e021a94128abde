#!/usr/bin/env bash
# The GPU run, in one call: install the carried wheel (dist/*.whl, built with
# `maturin build --release -o dist`), check the Triton kernels against the
# torch reference and time them, then the engine's offline throughput against
# transformers' generate; each part prints a short table last. Results go to $OUT
# (or /tmp). `--dry-run` runs the same script on the CPU at toy sizes.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}"
if [[ "${1:-}" == "--dry-run" ]]; then
    export TRITON_INTERPRET=1
    python3 benches/gpu/kernel_bench.py --dry-run --out "$out/kernels-dry.csv"
    python3 benches/gpu/simulate_fidelity.py --dry-run
    exec python3 benches/gpu/engine_bench.py --dry-run
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ironbatch-site dist/ironbatch-*.whl
export PYTHONPATH=/tmp/ironbatch-site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
set -o pipefail
python3 benches/gpu/kernel_bench.py --out "$out/kernels.csv" 2>&1 | tee "$out/kernels.log"
python3 benches/gpu/engine_bench.py 2>&1 | tee "$out/engine.log"
python3 benches/gpu/simulate_fidelity.py 2>&1 | tee "$out/simulate_fidelity.log"
