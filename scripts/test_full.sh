#!/usr/bin/env bash
# The test command at full size (docs/testing.md): every random-workload and
# differential suite runs its full number of workloads (IRONBATCH_FULL=1),
# each Rust property test 2,560 cases (256 and 300 a run). Before a release,
# or when a suite or what it tests changes. Run it where the test command
# ran (its .venv active, the vLLM venv made). One seed for every phase: set
# IRONBATCH_SEED to replay a run, else one is drawn and printed. Arguments
# go to both pytest runs (-x, -k ...).
set -euo pipefail
cd "$(dirname "$0")/.."
export IRONBATCH_FULL=1 PROPTEST_CASES=2560
export IRONBATCH_SEED="${IRONBATCH_SEED:-$(python3 -c 'import secrets; print(secrets.randbelow(2**32))')}"
export PROPTEST_RNG_SEED="$IRONBATCH_SEED"
echo "test_full.sh: IRONBATCH_SEED=$IRONBATCH_SEED (proptest: PROPTEST_RNG_SEED=$IRONBATCH_SEED)"
cargo test --locked
python -m pytest "$@"
bash scripts/test_vllm.sh "$@"
