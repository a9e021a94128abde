"""Check built release artifacts beyond their metadata (twine checks that):
every wheel is abi3 with a manylinux or musllinux tag and carries the
extension, its type stubs, py.typed and the Triton kernels, and no test or
benchmark files; the sdist carries what a build from scratch needs.

    python scripts/check_release.py DIST_DIR
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

WHEEL_MUST_HAVE = (
    "ironbatch/__init__.py",
    "ironbatch/_core.abi3.so",
    "ironbatch/_core.pyi",
    "ironbatch/py.typed",
    "ironbatch/kernels/unified_attention.py",
    "ironbatch/kernels/reshape_and_cache.py",
    "ironbatch/reference/__init__.py",
)
WHEEL_MUST_NOT = ("tests/", "benches/", "ironbatch/tests/", "conftest.py")
SDIST_MUST_HAVE = ("pyproject.toml", "Cargo.toml", "Cargo.lock", "rust/src/lib.rs", "README.md")


def check_wheel(path: Path) -> list[str]:
    problems = []
    tags = path.stem.split("-")[-3:]  # python, abi, platform
    if tags[:2] != ["cp310", "abi3"]:
        problems.append(f"{path.name}: not a cp310-abi3 wheel ({'-'.join(tags[:2])})")
    if not any(p.startswith(("manylinux", "musllinux")) for p in tags[2].split(".")):
        problems.append(f"{path.name}: platform tag {tags[2]} is neither manylinux nor musllinux")
    names = zipfile.ZipFile(path).namelist()
    problems += [f"{path.name}: lacks {n}" for n in WHEEL_MUST_HAVE if n not in names]
    problems += [
        f"{path.name}: carries {n}" for n in names if n.startswith(WHEEL_MUST_NOT) or "/tests/" in n
    ]
    return problems


def check_sdist(path: Path) -> list[str]:
    root = path.name.removesuffix(".tar.gz")
    names = set(tarfile.open(path).getnames())
    return [f"{path.name}: lacks {n}" for n in SDIST_MUST_HAVE if f"{root}/{n}" not in names]


def main(dist: str) -> int:
    wheels = sorted(Path(dist).glob("*.whl"))
    sdists = sorted(Path(dist).glob("*.tar.gz"))
    problems = [] if wheels and sdists else [f"{dist}: needs at least one wheel and an sdist"]
    for w in wheels:
        problems += check_wheel(w)
    for s in sdists:
        problems += check_sdist(s)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"checked {len(wheels)} wheel(s) and {len(sdists)} sdist(s) in {dist}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "dist"))
