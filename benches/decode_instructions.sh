#!/usr/bin/env bash
# Instructions per request per steady decode step of the core, counted by
# callgrind over `benches/decode_step.rs`'s timed step (its
# `timed_step` is the toggle point). A count, not a time: the same binary
# and inputs give the same number on a loaded or noisy machine, so two
# builds compare in one run where wall-clock medians drift by a third.
#
#     bash benches/decode_instructions.sh [RUNNING ...]    (default: 16 256 1024)
#
# Needs valgrind (Debian: `apt-get install valgrind`).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=200
# Built as `cargo bench` builds it (the release profile).
bench=$(cargo bench --bench decode_step --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "decode_step" and m.get("executable"):
        print(m["executable"])')
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "| running | instructions per step | per request |"
echo "|---|---|---|"
for running in "${@:-16 256 1024}"; do
    for n in $running; do
        valgrind --tool=callgrind --toggle-collect='*timed_step*' \
            --callgrind-out-file="$out" "$bench" "$n" "$steps" 0 >/dev/null 2>&1
        total=$(grep -m1 '^summary:' "$out" | awk '{print $2}')
        awk -v t="$total" -v n="$n" -v s="$steps" \
            'BEGIN { printf "| %d | %.0f | %.1f |\n", n, t / s, t / s / n }'
    done
done
