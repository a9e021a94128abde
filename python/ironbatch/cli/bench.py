"""'ironbatch bench': the scheduler's time per step, schedule() plus
update_from_output(), on the Rust core and its Python twin (--json: the
medians as JSON)."""

from __future__ import annotations

import argparse
import platform
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence

from ironbatch.bench import WORKLOADS, IronbatchDriver, format_table, run
from ironbatch.cli.options import add_json_flag, integer, progress, to_json

BACKENDS = ("rust", "python")
# The default: one workload of each kind the core's own drivers run alone;
# the others time the same steps with a feature on (JSON schemas, KV events,
# n-gram drafts, gpt-oss's window).
DEFAULT_WORKLOADS = ("decode-64", "decode-256", "decode-1024", "mixed")
# JSON schemas, KV-cache events, n-gram drafts and KV connectors (NIXL, CPU
# offloading) are features of vLLM's interface: the core's drivers would run
# those workloads as the plain ones, or with a stand-in connector.
CORE_WORKLOADS = [
    name
    for name, w in WORKLOADS.items()
    if not (
        w.structured_every
        or w.kv_events
        or w.num_speculative_tokens
        or w.remote_prefill
        or w.cpu_offload
    )
]
ELSEWHERE = {
    name: "times a feature of vLLM's interface, which this command's drivers leave out "
    "(benches/compare_vllm.py runs it)"
    for name in WORKLOADS
    if name not in CORE_WORKLOADS
}
MAX_STEPS = 1_000_000


def names(
    what: str,
    choices: Sequence[str],
    every: str | None = None,
    elsewhere: Mapping[str, str] | None = None,
) -> Callable[[str], list[str]]:
    """A ``type=`` converter: comma-separated names from ``choices`` (or
    ``every`` for all of them), each once; ``elsewhere`` says why a name
    that is not a choice is not."""

    def parse(text: str) -> list[str]:
        if every is not None and text.strip() == every:
            return list(choices)
        got = [n.strip() for n in text.split(",")]
        unknown = next((n for n in got if n not in choices), None)
        if unknown is not None:
            why = (elsewhere or {}).get(unknown, f"unknown {what}")
            raise argparse.ArgumentTypeError(
                f"{unknown!r}: {why}; choose from {', '.join(choices)}"
            )
        twice = next((n for n in got if got.count(n) > 1), None)
        if twice is not None:
            raise argparse.ArgumentTypeError(f"{twice!r} is given twice, got {text!r}")
        return got

    parse.__name__ = what
    return parse


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Wraps option help at spaces only: a workload's name
    (``jamba-align-64``) stays whole on its line, to be copied as it is."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def add_parser(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench",
        help="time schedule() + update_from_output() per step",
        description=__doc__,
        formatter_class=_HelpFormatter,
    )
    b.add_argument(
        "--workloads",
        type=names("workload", CORE_WORKLOADS, every="all", elsewhere=ELSEWHERE),
        default=list(DEFAULT_WORKLOADS),
        help=f"comma-separated names from {', '.join(CORE_WORKLOADS)}, or all of them "
        f"(default: {','.join(DEFAULT_WORKLOADS)})",
    )
    b.add_argument(
        "--steps",
        type=integer(1, MAX_STEPS),
        default=100,
        help="timed steps per workload and backend (default 100)",
    )
    b.add_argument(
        "--backends",
        type=names("backend", BACKENDS),
        default=list(BACKENDS),
        help="comma-separated, from rust, python; the table's ratios are to the first "
        "(default: rust,python)",
    )
    b.add_argument(
        "--turn",
        type=integer(1, MAX_STEPS),
        default=1,
        help="consecutive steps per scheduler before the next takes its turn, at most --steps "
        "(default 1)",
    )
    add_json_flag(b, "the medians (seconds per step)")


def bench_main(args: argparse.Namespace) -> int:
    steps, turn = args.steps, args.turn
    if turn > steps:
        raise ValueError(f"--turn {turn} is more than --steps {steps}; give --turn <= --steps")
    # Steps are timed in whole turns.
    timed = -(-steps // turn) * turn
    drivers = [lambda w, b=b: IronbatchDriver(w, b) for b in args.backends]
    with progress(len(args.workloads), "bench") as bar:

        def log(line: str) -> None:
            # A bar's own write keeps the line from landing inside the bar.
            write = getattr(bar, "write", None)
            if write is None:
                print(line, file=sys.stderr)
            else:
                write(line, file=sys.stderr)
            bar.update(1)

        workloads = [WORKLOADS[w] for w in args.workloads]
        rows = run(drivers, workloads, steps=steps, turn=turn, log=log)
    if args.json:
        doc = {
            "machine": platform.machine(),
            "python": platform.python_version(),
            "steps": timed,
            "turn": turn,
            "rows": [{"workload": r["workload"], "median_step_s": r["medians"]} for r in rows],
        }
        print(to_json(doc))
        return 0
    print(
        f"{platform.machine()}, Python {platform.python_version()}, {timed} timed steps per "
        f"workload, turns of {turn} step(s); median per step, Python boundary included"
    )
    print(format_table(rows))
    return 0
