"""``--report`` in a real browser: headless Chromium (Debian's package,
installed here if missing; skipped with the reason only if it cannot be)
loads the page from a file, with no network; it must run without a console
error, and its screenshot must show charts, not a blank page."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ironbatch.simulation import report, simulate, synthetic_workload
from ironbatch.simulation.report import write_sweep_report
from ironbatch.simulation.sweep import run_sweep

CLOCK = "linear:intercept_s=0.008,per_prefill_token_s=2e-5,per_decode_token_s=2e-4"


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("no chromium, and apt-get cannot run here to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode:
            pytest.skip(f"chromium could not be installed: {' '.join(cmd)}: {done.stderr[-300:]}")
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("apt-get installed chromium, but it is not on PATH")
    return path


def headless(page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=4000", *args,
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def png_pixels(path: Path) -> np.ndarray:
    """A screenshot's RGB pixels."""
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def check_page(page: Path, tmp_path: Path, dom: list[str] | None = None) -> np.ndarray:
    """One browser run: the DOM after the scripts ran (the page marks its
    body with its status and any error it caught) and a screenshot."""
    shot = tmp_path / "shot.png"
    done = headless(page, "--dump-dom", f"--screenshot={shot}", "--window-size=1000,1300")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    if dom is not None:
        dom.append(done.stdout)
    body = done.stdout[done.stdout.index("<body") :].split(">", 1)[0]
    assert 'data-status="ok"' in body and 'data-errors="0"' in body, body
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    pixels = png_pixels(shot)
    not_white = (pixels < 240).any(axis=2).mean()
    colours = len(np.unique(pixels.reshape(-1, 3)[::7], axis=0))
    assert not_white > 0.02 and colours > 20, (not_white, colours)
    return pixels


def test_the_report_renders_without_errors(tmp_path: Path) -> None:
    w = synthetic_workload("synthetic:requests=300,rate=10,prefix_groups=3,arrivals=bursty")
    r = simulate(w, step_model=CLOCK, config={"max_num_seqs": 24}, slo="ttft=100ms")
    r.write(tmp_path / "run", report=True)
    page = tmp_path / "run" / "report.html"
    html = page.read_text()
    assert "http://" not in html and "https://" not in html  # nothing to fetch
    pixels = check_page(page, tmp_path)
    # The charts drawn, in their colours (far more pixels than the legend's
    # swatches): decode bars and the running line (blue), prefill bars
    # (orange), the KV-usage line (green).
    flat = pixels.reshape(-1, 3).astype(int)
    for rgb, least in (((0x2F, 0x6F, 0xDB), 2000), ((0xE0, 0x7B, 0x24), 500),
                       ((0x2E, 0x9E, 0x5B), 500)):  # fmt: skip
        drawn = int((np.abs(flat - rgb).sum(axis=1) < 30).sum())
        assert drawn > least, (rgb, drawn)


def test_the_sweep_report_renders_without_errors(tmp_path: Path) -> None:
    w = synthetic_workload("synthetic:requests=80,rate=20,prompt_mean=200,output_mean=20")
    axes = [("max_num_seqs", [4, 16]), ("num_blocks", [5, 2000])]
    sweep = run_sweep(w, axes, step_model=CLOCK, jobs=1)
    page = write_sweep_report(tmp_path / "sweep.html", sweep)
    dom: list[str] = []
    check_page(page, tmp_path, dom)
    # The wide table scrolls in its box; an infeasible point's reason is in its row.
    assert '<div class="scroll"><table>' in dom[0]
    assert dom[0].count('class="infeasible"') == 2 and "the KV cache is too small" in dom[0]
    assert "(2 infeasible)" in dom[0]


def test_a_thinned_request_strip_says_so_on_the_chart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report, "MAX_REQUESTS", 100)
    r = simulate(synthetic_workload("synthetic:requests=300,rate=50"), step_model=CLOCK)
    r.write(tmp_path, report=True)
    dom: list[str] = []
    check_page(tmp_path / "report.html", tmp_path, dom)
    heading = dom[0][dom[0].index("Requests: queued, prefill, decode") :].split("</h2>")[0]
    assert "100 of 300 requests shown" in heading
