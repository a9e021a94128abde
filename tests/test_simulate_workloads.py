"""The simulator's workloads: each reader on small files written here, the
synthetic generator, slicing and rate scaling, and the shared prefixes that
turn into prefix-cache hits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ironbatch.bench.azure_trace import synthetic_trace_csv
from ironbatch.simulation import load_workload, simulate, synthetic_workload
from ironbatch.simulation.load import detect_format

CLOCK = "linear:intercept_s=0.01,per_prefill_token_s=1e-5,per_decode_token_s=1e-4"
SYNC = {"async_scheduling": False}


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def mooncake_lines(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_an_azure_csv_reads_as_its_rows(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", synthetic_trace_csv(50, seed=3))
    w = load_workload(path)
    assert detect_format(path) == "azure" and len(w) == 50
    assert w.arrival_s[0] == 0 and (np.diff(w.arrival_s) >= 0).all()
    lines = path.read_text().splitlines()[1:]
    assert w.prompt_tokens.tolist() == [int(x.split(",")[1]) for x in lines]
    assert w.output_tokens.tolist() == [int(x.split(",")[2]) for x in lines]
    # Lengths only: no prompt shares a token run with another.
    assert simulate(w, step_model=CLOCK).summary["prefix_hit_rate"] == 0


def test_mooncake_hash_ids_become_shared_prefixes(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [1, 2, 3]},
        {"timestamp": 500, "input_length": 1030, "output_length": 3, "hash_ids": [1, 2, 9]},
        {"timestamp": 1000, "input_length": 600, "output_length": 3, "hash_ids": [4, 5]},
        {"timestamp": 2000, "input_length": 700, "output_length": 2, "hash_ids": [4]},
    ]
    path = write(tmp_path / "m.jsonl", mooncake_lines(rows))
    w = load_workload(path)
    assert detect_format(path) == "mooncake"
    assert w.arrival_s.tolist() == [0.0, 0.5, 1.0, 2.0]
    assert w.prompt_tokens.tolist() == [1100, 1030, 600, 700]
    p = [w.prompt_token_ids(i) for i in range(4)]
    assert p[0][:1024] == p[1][:1024] and p[0][1024:1030] != p[1][1024:1030]
    assert p[2][:512] == p[3][:512] and p[2][512:] != p[3][512:600]
    r = simulate(w, step_model=CLOCK, config=SYNC)
    # Two shared 512-token blocks are 64 blocks of 16; one shared block 32.
    assert r.requests["prefix_hit_tokens"].tolist() == [0, 1024, 0, 512]


def test_a_burstgpt_csv_skips_failed_requests(tmp_path: Path) -> None:
    text = (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "7,ChatGPT,1000,0,1000,Conversation log\n"
        "9.5,GPT-4,52,230,282,API log\n"
    )
    w = load_workload(write(tmp_path / "b.csv", text))
    assert w.arrival_s.tolist() == [0.0, 4.5]
    assert w.prompt_tokens.tolist() == [472, 52] and w.output_tokens.tolist() == [18, 230]
    r = simulate(w, step_model=CLOCK)
    assert r.rejected == {"no request or no response tokens": 1}


def test_a_simulation_trace_is_itself_a_workload(tmp_path: Path) -> None:
    w = synthetic_workload("synthetic:requests=30,rate=50,prompt_mean=60,output_mean=6,seed=2")
    trace = tmp_path / "t.jsonl"
    first = simulate(w, step_model=CLOCK, config=SYNC, trace=trace)
    again = load_workload(trace)
    assert detect_format(trace) == "trace" and len(again) == 30
    assert again.prompt_token_ids(7) == w.prompt_token_ids(7)
    second = simulate(again, step_model=CLOCK, config=SYNC)
    np.testing.assert_array_equal(second.requests["e2e_s"], first.requests["e2e_s"])


def test_the_synthetic_generator_is_deterministic_and_groups_prefixes() -> None:
    spec = "synthetic:requests=200,rate=20,prefix_groups=3,prefix_tokens=64,prefix_share=1,seed=7"
    a, b = synthetic_workload(spec), synthetic_workload(spec)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    assert a.prompt_token_ids(5) == b.prompt_token_ids(5)
    heads = {tuple(a.prompt_token_ids(i)[:32]) for i in range(200) if a.prompt_tokens[i] > 64}
    assert len(heads) == 3
    assert simulate(a, step_model=CLOCK).summary["prefix_hit_rate"] > 0.05
    other = synthetic_workload(spec.replace("seed=7", "seed=8"))
    assert not np.array_equal(other.arrival_s, a.arrival_s)


def test_bursty_arrivals_keep_the_rate_and_clump() -> None:
    def gaps(kind: str) -> np.ndarray:
        w = synthetic_workload(f"synthetic:requests=4000,rate=10,arrivals={kind}")
        return np.diff(w.arrival_s)

    poisson, bursty = gaps("poisson"), gaps("bursty")
    assert abs(poisson.mean() - 0.1) < 0.01 and abs(bursty.mean() - 0.1) < 0.02
    cv = bursty.std() / bursty.mean()
    assert cv > 2 and abs(poisson.std() / poisson.mean() - 1) < 0.1


def test_slicing_and_speed() -> None:
    w = synthetic_workload("synthetic:requests=100,rate=10,seed=1")
    part = w.sliced(start_s=2.0, end_s=5.0)
    inside = (w.arrival_s >= 2) & (w.arrival_s < 5)
    assert len(part) == inside.sum()
    np.testing.assert_allclose(part.arrival_s, w.arrival_s[inside] - 2.0)
    assert part.prompt_token_ids(0) == w.prompt_token_ids(int(np.flatnonzero(inside)[0]))
    assert len(w.sliced(max_requests=7)) == 7
    np.testing.assert_allclose(w.at_speed(4).arrival_s, w.arrival_s / 4)
    fast = simulate(w, step_model=CLOCK, speed=4)
    slow = simulate(w, step_model=CLOCK)
    assert fast.requests["arrival_s"][-1] == pytest.approx(slow.requests["arrival_s"][-1] / 4)
    # Four times the load on the same engine: more requests run at once.
    assert fast.steps["num_running"].max() > 2 * slow.steps["num_running"].max()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,12,x\n",
         "GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,12,3\n", "TIMESTAMP"),
        ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
         "1,m,-4,2,0,x\n", "Request tokens"),
    ],
)  # fmt: skip
def test_a_malformed_csv_row_is_named(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path / "bad.csv", text)
    with pytest.raises(ValueError, match=f"line 2.*{needle}"):
        load_workload(path)


def test_a_malformed_mooncake_line_is_named(tmp_path: Path) -> None:
    good = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
    for bad, needle in [
        ({**good, "input_length": -1}, "input_length"),
        ({**good, "hash_ids": [1, 2]}, "hash_ids"),
        ({**good, "hash_ids": "x"}, "hash_ids"),
    ]:
        path = write(tmp_path / "m.jsonl", mooncake_lines([good, bad]))
        with pytest.raises(ValueError, match=f"line 2: .*{needle}"):
            load_workload(path)
