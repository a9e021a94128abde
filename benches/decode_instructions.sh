#!/usr/bin/env bash
# Instructions per request per steady decode step of the core, counted by
# callgrind over `benches/decode_step.rs`'s timed step (its
# `timed_step` is the toggle point), and the data-cache misses of a cold
# step per request: each step after a 2 MiB write, with callgrind's cache
# model set to this machine's per-core L1d (32 KiB) and L2 (1 MiB), so a
# "last-level" miss is an L2 miss (a line the step had to bring from L3
# or DRAM). Counts, not times: the same binary and inputs give the same
# numbers on a loaded or noisy machine, so two builds compare in one run
# where wall-clock medians drift by a third.
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
echo "| running | instructions per step | per request | cold step: L2 misses per request (read + write) |"
echo "|---|---|---|---|"
for running in "${@:-16 256 1024}"; do
    for n in $running; do
        valgrind --tool=callgrind --toggle-collect='*timed_step*' \
            --callgrind-out-file="$out" "$bench" "$n" "$steps" 0 >/dev/null 2>&1
        total=$(grep -m1 '^summary:' "$out" | awk '{print $2}')
        # Every step cold: a 2 MiB write before it (EVICT_KIB 2048, EVICT_EVERY 1).
        valgrind --tool=callgrind --toggle-collect='*timed_step*' --cache-sim=yes \
            --D1=32768,8,64 --LL=1048576,16,64 \
            --callgrind-out-file="$out" "$bench" "$n" "$steps" 2048 1 >/dev/null 2>&1
        # The events line names the columns; DLmr and DLmw are L2 read and write misses.
        misses=$(awk '/^events:/ { for (i = 2; i <= NF; i++) col[$i] = i - 1 }
            /^summary:/ { print $(col["DLmr"] + 1) + $(col["DLmw"] + 1) }' "$out")
        awk -v t="$total" -v m="$misses" -v n="$n" -v s="$steps" \
            'BEGIN { printf "| %d | %.0f | %.1f | %.2f |\n", n, t / s, t / s / n, m / s / n }'
    done
done
