"""The release build: scripts/build_release.sh makes an abi3 manylinux wheel
(and an sdist) that installs and runs where no Rust toolchain is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "traces" / "vllm-0001.jsonl"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("cargo") is None:
        pytest.skip("building the release needs cargo")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build_release.sh"), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_the_wheel_is_abi3_manylinux_and_carries_what_it_should(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    assert "-cp310-abi3-manylinux2014_x86_64" in wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("ironbatch/_core.abi3.so", "ironbatch/_core.pyi", "ironbatch/py.typed"):
        assert needed in names
    assert "ironbatch/kernels/unified_attention.py" in names
    assert not [n for n in names if n.startswith(("tests/", "benches/"))]
    (sdist,) = dist.glob("*.tar.gz")
    assert sdist.name == wheel.name.split("-cp310")[0] + ".tar.gz"


def test_the_wheel_runs_without_a_rust_toolchain(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    # Nothing from ~/.cargo: only the venv and the system's basic tools.
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    env.pop("PYTHONPATH", None)
    assert shutil.which("cargo", path=env["PATH"]) is None
    pip = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    check = subprocess.run(
        [
            str(bin_dir / "python"),
            "-c",
            "import importlib.metadata as m, ironbatch, ironbatch._core; "
            "assert ironbatch.__version__ == m.version('ironbatch'); print(ironbatch.__file__)",
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert check.returncode == 0, check.stderr
    assert str(env_dir) in check.stdout  # the installed wheel, not the checkout
    replay = subprocess.run(
        [str(bin_dir / "ironbatch"), "replay", str(TRACE)],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert replay.returncode == 0 and "1 of 1 identical" in replay.stdout, replay.stderr


def test_the_version_has_one_source() -> None:
    import importlib.metadata

    import ironbatch

    cargo = (ROOT / "Cargo.toml").read_text()
    assert f'version = "{ironbatch.__version__}"' in cargo
    assert importlib.metadata.version("ironbatch") == ironbatch.__version__
    assert sys.version_info >= (3, 10)
