"""The ironbatch command: demo, generate, replay, bench, simulate and
profile. 'ironbatch COMMAND --help' describes each."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ironbatch.cli.options import Parser


def build_parser() -> Parser:
    """The command's parser: a bad option exits with status 2 and one line.
    Each command's module adds its parser and runs it (``<name>_main``)."""
    import ironbatch
    from ironbatch.cli import bench, demo, generate, profile, replay, simulate

    parser = Parser(prog="ironbatch", description=__doc__)
    version = f"ironbatch {ironbatch.__version__}"
    parser.add_argument("--version", action="version", version=version,
                        help="print ironbatch's version and exit")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="one of these (each has its own --help)")  # fmt: skip
    for module in (demo, generate, replay, bench, simulate, profile):
        name = module.__name__.rpartition(".")[2]
        module.add_parser(sub)
        sub.choices[name].set_defaults(run=getattr(module, f"{name}_main"))
    return parser


# What ``pip install "ironbatch[engine]"`` adds (pyproject.toml): a base
# install simulates, replays and benches without them.
ENGINE_MODULES = frozenset({"torch", "safetensors", "tokenizers", "tqdm"})


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except ModuleNotFoundError as e:
        package = (e.name or "").partition(".")[0]
        if package not in ENGINE_MODULES:
            raise
        print(
            f"ironbatch {args.command}: needs the engine's dependencies ({package} is not "
            'installed): install the engine extra, pip install ".[engine]" (docs/install.md)',
            file=sys.stderr,
        )
        return 1
    # What an option's value makes the command refuse, on one line.
    except (ValueError, TypeError) as e:
        print(f"ironbatch {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
