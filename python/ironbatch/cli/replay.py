"""``ironbatch replay``: one line per trace (or ``--json``), exit status 1 on
any difference or any trace that cannot be replayed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ironbatch.cli.options import progress, to_json
from ironbatch.trace import TraceError, replay


def replay_main(paths: list[str], backend: str, level: str, as_json: bool = False) -> int:
    different = 0
    results: list[dict[str, Any]] = []
    for path in paths:
        try:
            with progress(None, Path(path).name) as bar:
                result = replay(path, backend=backend, level=level, on_step=bar.update)
        # A bad file is reported and the next one replayed; the error names
        # the file and the line.
        except TraceError as e:
            different += 1
            results.append({"path": path, "identical": False, "error": str(e)})
            if not as_json:
                print(f"cannot replay {e}")
            continue
        different += not result.identical
        results.append(result.as_dict())
        if not as_json:
            print(result)
    identical = len(paths) - different
    if as_json:
        summary = {"level": level, "backend": backend, "identical": identical}
        print(to_json(summary | {"traces": len(paths), "results": results}))
    else:
        print(f"{identical} of {len(paths)} identical at {level} level ({backend})")
    return 1 if different else 0
