"""``ironbatch replay``: one line per trace, exit status 1 on any difference."""

from __future__ import annotations

from ironbatch.trace import replay


def replay_main(paths: list[str], backend: str, level: str) -> int:
    different = 0
    for path in paths:
        try:
            result = replay(path, backend=backend, level=level)
        # A bad file is reported and the next one replayed: unreadable or
        # truncated (OSError, EOFError), not JSON or not a trace (ValueError,
        # KeyError), a field of the wrong type (TypeError).
        except (OSError, EOFError, ValueError, KeyError, TypeError) as e:
            print(f"{path}: cannot replay: {e}")
            different += 1
            continue
        print(result)
        different += not result.identical
    print(f"{len(paths) - different} of {len(paths)} identical at {level} level ({backend})")
    return 1 if different else 0
