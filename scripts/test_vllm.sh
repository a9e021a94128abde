#!/usr/bin/env bash
# The vLLM drop-in's tests (tests/vllm_dropin), in a venv of their own: vLLM
# 0.33.0 pins its own torch, so it cannot share the project's venv. The venv
# is created once (about 9 GB, 5 minutes) and reused: set IRONBATCH_VLLM_VENV
# to choose where (default: ~/.cache/ironbatch/vllm-0.33.0-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${IRONBATCH_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ironbatch/vllm-0.33.0-venv}"
if ! "$venv/bin/python" -c "import vllm, pytest; assert vllm.__version__ == '0.33.0'" 2>/dev/null; then
    echo "test_vllm.sh: creating the vLLM venv at $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --upgrade pip
    "$venv/bin/pip" install "vllm==0.33.0" "pytest>=8"
fi
# This checkout's ironbatch, built fresh (vLLM's dependencies are already there).
"$venv/bin/pip" install --force-reinstall --no-deps .
"$venv/bin/python" -m pytest tests/vllm_dropin "$@"
