"""``ironbatch replay``: one line per trace, exit status 1 on any difference."""

from __future__ import annotations

from ironbatch.trace import replay


def replay_main(paths: list[str], backend: str, level: str) -> int:
    different = 0
    for path in paths:
        try:
            result = replay(path, backend=backend, level=level)
        except (OSError, ValueError, KeyError) as e:
            print(f"{path}: cannot replay: {e}")
            different += 1
            continue
        print(result)
        different += not result.identical
    print(f"{len(paths) - different} of {len(paths)} identical at {level} level ({backend})")
    return 1 if different else 0
