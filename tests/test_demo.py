"""``ironbatch demo`` on a small scale: it runs to completion through the real
loader, preempts on its tight cache, reuses shared system prompts, and
reports the summary table."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from ironbatch.cli import main  # noqa: E402
from ironbatch.cli.demo import run_demo  # noqa: E402


def test_demo_summary() -> None:
    s = run_demo(None, num_requests=40, max_num_seqs=16, num_blocks=60, seed=1, quiet=True)
    assert s["requests"] == 40
    assert s["preemptions"] > 0
    assert s["prefix-cache hit rate"] > 0.3
    assert 0.9 <= s["peak KV usage"] <= 1.0
    # 40 requests through 16 sequences: later ones queue, so the tail waits
    # longer than the median, and no first token comes after the run ended.
    assert 0 < s["TTFT p50 (s)"] < s["TTFT p99 (s)"] <= s["seconds"] + 1.0
    assert 0 < s["TPOT p50 (ms)"] <= s["TPOT p99 (ms)"]
    out_tokens = s["output tokens/s"] * s["seconds"]
    assert 40 * 16 <= round(out_tokens) <= 40 * 64  # max_tokens is drawn from 16..64


def test_demo_and_generate_commands(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from ironbatch.model.random_model import write_random_llama

    assert main(["demo", "--requests", "8", "--max-num-seqs", "4"]) == 0
    out = capsys.readouterr().out
    assert "| requests | 8 |" in out and "output tokens/s" in out
    write_random_llama(tmp_path)
    assert (
        main(["generate", "--model", str(tmp_path), "--prompt", "ids:5,6,7", "--max-tokens", "3"])
        == 0
    )
    assert "[length]" in capsys.readouterr().out
