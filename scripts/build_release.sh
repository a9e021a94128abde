#!/usr/bin/env bash
# Build ironbatch's release artifacts and check them: one abi3 wheel per
# target (CPython >= 3.10) with a manylinux or musllinux tag, and an sdist.
#
#   scripts/build_release.sh [--out DIR] [--target TRIPLE]...
#
# The default target is x86_64-unknown-linux-gnu. Wheels are linked with zig
# (the `ziglang` package from PyPI) against a fixed glibc floor, so no
# container is needed: *-linux-gnu targets get manylinux2014 (glibc 2.17),
# *-linux-musl targets musllinux_1_2. maturin's own audit refuses a wheel
# whose symbols break its tag. Other targets need their Rust standard
# library (`rustup target add aarch64-unknown-linux-gnu`); the release
# workflow (.github/workflows/release.yml) builds those.
#
# Tools (maturin, ziglang, twine) come from PyPI into a venv of their own,
# made once and reused: IRONBATCH_RELEASE_VENV chooses where (default:
# ~/.cache/ironbatch/release-venv).
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --target) targets+=("$2"); shift 2 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "build_release.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || targets=(x86_64-unknown-linux-gnu)

venv="${IRONBATCH_RELEASE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ironbatch/release-venv}"
if ! "$venv/bin/python" -c "import maturin, ziglang, twine" 2>/dev/null; then
    echo "build_release.sh: creating the tools venv at $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "maturin>=1.9,<2" "ziglang>=0.13" "twine>=6"
fi
export PATH="$venv/bin:$PATH"

mkdir -p "$out"
for target in "${targets[@]}"; do
    case "$target" in
        *-linux-gnu) compatibility=manylinux2014 ;;
        *-linux-musl) compatibility=musllinux_1_2 ;;
        *) echo "build_release.sh: no tag known for target $target" >&2; exit 2 ;;
    esac
    maturin build --release --zig --target "$target" --compatibility "$compatibility" --out "$out"
done
maturin sdist --out "$out"
twine check --strict "$out"/*
"$venv/bin/python" scripts/check_release.py "$out"
