"""Graph-ready decode steps on the CPU: the padded static path gives the
tokens the eager path gives (``enforce_eager=True``), at every padded batch
size, with requests joining, finishing and being preempted between steps,
greedy and sampled; padding rows write only the scratch block; and the
capture-and-replay logic, with CUDA graphs stood in for by replaying the
captured body, reads a step's inputs only through the static buffers."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ironbatch import SamplingParams  # noqa: E402
from ironbatch.engine.llm_engine import EngineArgs, LLMEngine  # noqa: E402
from ironbatch.model import cuda_graphs  # noqa: E402
from ironbatch.model.decode_buffers import padded_batch_sizes  # noqa: E402
from ironbatch.model.random_model import write_random_llama  # noqa: E402

QWEN3_TINY = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": False,
    "eos_token_id": 2,
    "dtype": "float32",
}

#: The sampler's paths in turn: plain greedy; batched (seeded greedy, top-p
#: from the engine's generator, logprobs); one row at a time (a seed of its
#: own, a penalty, a pending min_tokens).
PARAMS = [
    dict(temperature=0.0),
    dict(temperature=0.8, top_k=12, seed=7),
    dict(temperature=1.0, top_p=0.9),
    dict(temperature=0.0, logprobs=2),
    dict(temperature=0.7, repetition_penalty=1.3),
    dict(temperature=0.9, min_tokens=6),
    dict(temperature=0.0, seed=3),
]

Plan = dict[int, list[tuple[str, list[int], SamplingParams]]]


def workload(arrivals: dict[int, int], *, seed: int = 0, most_new: int = 28) -> Plan:
    """Requests to add before each step: prompts of 3-12 tokens, 6 to
    ``most_new`` new tokens each, the parameter kinds above in turn."""
    rng = random.Random(seed)
    plan: Plan = {}
    i = 0
    for step, count in arrivals.items():
        plan[step] = []
        for _ in range(count):
            prompt = [rng.randrange(3, 96) for _ in range(rng.randrange(3, 13))]
            kind = PARAMS[i % len(PARAMS)]
            params = SamplingParams(
                max_tokens=rng.randrange(6, most_new + 1), ignore_eos=True, **kind
            )
            plan[step].append((f"r{i}", prompt, params))
            i += 1
    return plan


def drive(path: Path, plan: Plan, **engine_args: Any) -> tuple[dict, dict, LLMEngine]:
    """A new engine through the plan."""
    engine = LLMEngine(EngineArgs(model=str(path), dtype="float32", **engine_args))
    return (*drive_engine(engine, plan), engine)


def drive_engine(engine: LLMEngine, plan: Plan) -> tuple[dict, dict]:
    """Step the engine, adding the planned requests between steps; returns
    each request's tokens and logprobs."""
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list] = {}
    step = 0
    while step <= max(plan) or engine.has_unfinished_requests():
        for rid, prompt, params in plan.get(step, []):
            engine.add_request(rid, {"prompt_token_ids": prompt}, params)
        for out in engine.step():
            if out.finished:
                tokens[out.request_id] = out.outputs[0].token_ids
                logprobs[out.request_id] = out.outputs[0].logprobs
        step += 1
    return tokens, logprobs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_llama(tmp_path_factory.mktemp("qwen3"), config=QWEN3_TINY)


@pytest.fixture(scope="module")
def one_layer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """For the interpreter, whose cost is per kernel program."""
    config = {**QWEN3_TINY, "num_hidden_layers": 1, "num_key_value_heads": 1}
    return write_random_llama(tmp_path_factory.mktemp("qwen3-1"), config=config)


def test_padded_batch_sizes() -> None:
    assert padded_batch_sizes(1) == [1]
    assert padded_batch_sizes(3) == [1, 2, 3]
    assert padded_batch_sizes(24) == [1, 2, 4, 8, 16, 24]
    assert padded_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    big = padded_batch_sizes(300)
    assert big[:5] == [1, 2, 4, 8, 16] and big[-4:] == [256, 272, 288, 300]
    with pytest.raises(ValueError, match="max_num_seqs"):
        padded_batch_sizes(0)


class CacheWatch:
    """Wraps the static path's ``run``: records each step's (rows, padded
    size) and checks that the KV cache changed only at the step's own slots
    and in the scratch block."""

    def __init__(self, engine: LLMEngine) -> None:
        runner = engine.runner
        self.static = runner.static_decode
        self.caches = runner.attn.k_caches + runner.attn.v_caches
        self.block_size = runner.block_size
        self.scratch = runner.scratch_block
        self.steps: list[tuple[int, int]] = []
        self.scratch_written = False
        # (rows, slots) of steps that wrote elsewhere: kept, not raised (the
        # engine would turn an exception in the forward into failed requests)
        self.strays: list[tuple[int, list[int]]] = []
        self.real_run = self.static.run
        self.static.run = self.run

    def run(self, **inputs: np.ndarray) -> torch.Tensor:
        before = [c.clone() for c in self.caches]
        hidden = self.real_run(**inputs)
        n = len(inputs["input_ids"])
        self.steps.append((n, hidden.shape[0]))
        allowed = set(inputs["slot_mapping"].tolist())
        for old, new in zip(before, self.caches, strict=True):
            flat_old, flat_new = old.flatten(0, 1), new.flatten(0, 1)
            changed = (flat_old != flat_new).flatten(1).any(1).nonzero().flatten().tolist()
            scratch = [s for s in changed if s // self.block_size == self.scratch]
            self.scratch_written |= bool(scratch)
            stray = sorted(set(changed) - allowed - set(scratch))
            if stray:
                self.strays.append((n, stray))
        return hidden


def test_static_decode_gives_the_eager_tokens_at_every_padded_size(model_dir: Path) -> None:
    # Joining in waves so decode batches of 1, 2, 3, 6, 14 and 22 rows occur
    # (padded to 1, 2, 4, 8, 16, 24), then shrinking as requests finish; a
    # tight KV cache preempts some and resumes them later.
    plan = workload({0: 1, 3: 1, 6: 1, 9: 3, 12: 8, 15: 8})
    settings = dict(num_blocks=70, block_size=4, max_num_seqs=24, max_model_len=64)
    eager_tokens, eager_logprobs, eager = drive(model_dir, plan, enforce_eager=True, **settings)
    assert eager.runner.static_decode is None

    engine = LLMEngine(EngineArgs(model=str(model_dir), dtype="float32", **settings))
    watch = CacheWatch(engine)
    engine_tokens, engine_logprobs = drive_engine(engine, plan)
    assert not watch.strays, "decode steps wrote KV outside their slots and the scratch block"
    assert engine_tokens == eager_tokens
    for rid, entries in eager_logprobs.items():
        if entries is not None:
            got = engine_logprobs[rid]
            assert [e.keys() for e in got] == [e.keys() for e in entries]
            for a, b in zip(got, entries, strict=True):
                assert np.allclose(list(a.values()), list(b.values()), atol=1e-5)
    padded = {size for _, size in watch.steps}
    assert padded == set(padded_batch_sizes(24)), padded
    assert any(n < size for n, size in watch.steps)
    assert watch.scratch_written, "padding rows write their K/V to the scratch block"
    assert engine.num_preemptions > 0 and eager.num_preemptions == engine.num_preemptions
    assert sum(engine.runner.static_decode.steps.values()) == len(watch.steps)


class ReplayedBody:
    """A stand-in CUDA graph: replaying runs the captured body again, so it
    sees only what the static buffers hold at replay time, as a real graph
    does (it cannot show a host-side decision taken at capture time; the
    backend's ``graph_capturable`` stands for that)."""

    def __init__(self, body: Any) -> None:
        self.body, self.replays = body, 0

    def replay(self) -> None:
        self.replays += 1
        self.body()


class ReplayingCapturer:
    """``cuda_graphs.CudaCapturer`` on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def warm_up(self, body: Any) -> None:
        body()

    def capture(self, body: Any) -> ReplayedBody:
        return ReplayedBody(body)

    def done(self) -> None:
        pass


def test_captured_graphs_replay_from_the_static_buffers(
    one_layer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("triton")
    import ironbatch.kernels.unified_attention as attention

    # The Triton backend and kernels in the interpreter: capturable, so the
    # runner captures a graph per padded size at start-up.
    monkeypatch.setattr(cuda_graphs, "capture_available", lambda device, capturable: capturable)
    monkeypatch.setattr(cuda_graphs, "CudaCapturer", ReplayingCapturer)
    # The 2D grid for decodes too: the split path's 16 programs per KV head
    # cost the interpreter seconds a step (tests/test_kernels.py covers it).
    monkeypatch.setattr(attention, "SPLIT_KV_BELOW_PROGRAMS", 0)
    plan = workload({0: 1, 2: 1, 4: 1}, seed=1, most_new=7)
    settings = dict(
        num_blocks=40, block_size=8, max_num_seqs=4, max_model_len=48, attention_backend="triton"
    )
    eager_tokens, _, _ = drive(one_layer_dir, plan, enforce_eager=True, **settings)
    tokens, _, engine = drive(one_layer_dir, plan, **settings)
    assert tokens == eager_tokens
    static = engine.runner.static_decode
    assert static.graphs is not None and sorted(static.graphs.graphs) == [1, 2, 4]
    replays = {size: graph.replays for size, graph in static.graphs.graphs.items()}
    assert all(replays.values()) and sum(replays.values()) == sum(static.steps.values())


def test_enforce_eager_must_be_a_bool(model_dir: Path) -> None:
    with pytest.raises(TypeError, match="enforce_eager must be a bool"):
        LLMEngine(EngineArgs(model=str(model_dir), enforce_eager="yes"))  # type: ignore[arg-type]


def test_the_generate_command_takes_enforce_eager(
    model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ironbatch.cli import main
    from ironbatch.engine import llm_engine

    made: list[bool] = []
    real = llm_engine.LLMEngine.__init__

    def spy(self: LLMEngine, args: EngineArgs) -> None:
        made.append(args.enforce_eager)
        real(self, args)

    monkeypatch.setattr(llm_engine.LLMEngine, "__init__", spy)
    argv = ["generate", "--model", str(model_dir), "--prompt", "ids:5,6,7", "--max-tokens", "3"]
    assert main(argv) == 0 and main([*argv, "--enforce-eager"]) == 0
    assert made == [False, True]
    assert capsys.readouterr().out.count("[length]") == 2
