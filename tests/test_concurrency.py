"""The concurrency contract. ``LLMEngine``: any number of threads may call
``add_request``/``abort_request`` while one thread steps. ``Scheduler``: one
caller at a time; a call made while another thread is inside raises
``RuntimeError`` and changes nothing, on both backends."""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from ironbatch import CacheConfig, Request, SamplingParams, Scheduler, SchedulerConfig

BACKENDS = ["rust", "python"]


def make_scheduler(backend: str, num_blocks: int = 64) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64),
        CacheConfig(num_blocks=num_blocks, block_size=8),
        backend=backend,
    )


def assert_consistent(sched: Scheduler) -> None:
    """The façade's requests are exactly the core's live ones."""
    state = sched.debug_state()
    assert set(sched.requests) == set(state["running"]) | set(state["waiting"])


def drain(sched: Scheduler) -> None:
    sched.finish_requests(list(sched.requests))
    assert not sched.has_unfinished_requests()
    assert sched.num_free_blocks == sched.cache_config.num_blocks - 1


class BlockingTokens(Mapping[str, list[int]]):
    """Sampled tokens whose reading waits until the test lets it go, so one
    thread sits inside ``update_from_output`` while another calls in."""

    def __init__(self, tokens: dict[str, list[int]]) -> None:
        self.tokens = tokens
        self.entered, self.release = threading.Event(), threading.Event()

    def items(self):  # type: ignore[override]
        self.entered.set()
        assert self.release.wait(30)
        return self.tokens.items()

    def __getitem__(self, key: str) -> list[int]:
        return self.tokens[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_call_from_a_second_thread_is_refused_and_changes_nothing(backend: str) -> None:
    sched = make_scheduler(backend)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=2), arrival_time=0.0))
    out = sched.schedule()
    tokens = BlockingTokens({"a": [7]})
    inside = threading.Thread(target=sched.update_from_output, args=(out, tokens))
    inside.start()
    assert tokens.entered.wait(30)
    late = Request("b", [4, 5], SamplingParams(max_tokens=2), arrival_time=1.0)
    for call in (
        lambda: sched.add_request(late),
        sched.schedule,
        lambda: sched.finish_requests(["a"]),
        lambda: sched.num_free_blocks,
        sched.make_stats,
    ):
        with pytest.raises(RuntimeError, match="single-threaded"):
            call()
    tokens.release.set()
    inside.join(30)
    assert not inside.is_alive()
    assert set(sched.requests) == {"a"}  # "b" was refused, not half-added
    assert_consistent(sched)
    sched.add_request(late)  # free again
    assert_consistent(sched)
    drain(sched)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_threads_hammering_one_scheduler_leave_it_consistent(backend: str) -> None:
    sched = make_scheduler(backend, num_blocks=40)
    refused = [0]
    unexpected: list[Exception] = []
    names = iter(range(10**9))

    def hammer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(400):
            try:
                op = rng.random()
                if op < 0.4:
                    prompt = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 30))]
                    sched.add_request(
                        Request(f"r{next(names)}", prompt, SamplingParams(max_tokens=3))
                    )
                elif op < 0.9:
                    out = sched.schedule()
                    sampling = [rid for rid, s in zip(out.req_ids, out.samples, strict=True) if s]
                    sched.update_from_output(out, {rid: [9] for rid in sampling})
                elif sched.requests:
                    sched.finish_requests([rng.choice(list(sched.requests))])
            except RuntimeError as e:
                assert "single-threaded" in str(e)
                refused[0] += 1
            except KeyError:
                pass  # a request id the other thread finished meanwhile
            except Exception as e:  # noqa: BLE001 - reported by the test
                unexpected.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=hammer, args=(s,)) for s in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        sys.setswitchinterval(interval)
    assert not unexpected, unexpected[:3]
    assert_consistent(sched)
    drain(sched)


def test_engine_serves_adder_threads_while_stepping(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from engine_models import build

    from ironbatch import LLM

    build("llama", tmp_path)
    llm = LLM(
        str(tmp_path),
        dtype="float32",
        num_blocks=48,
        block_size=8,
        max_model_len=64,
        max_num_seqs=16,
    )
    engine = llm.llm_engine
    adders, per_adder = 4, 500
    aborted: set[str] = set()
    added: set[str] = set()
    book = threading.Lock()
    shared = [3, 4, 5, 6, 7, 8, 9, 10]  # a common prefix: prefix hits under churn

    errors: list[BaseException] = []

    def add(worker: int) -> None:
        try:
            add_many(worker)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    def add_many(worker: int) -> None:
        rng = random.Random(worker)
        mine: list[str] = []
        for i in range(per_adder):
            rid = f"w{worker}-{i}"
            prompt = shared[: rng.randrange(9)] + [rng.randrange(11, 150) for _ in range(4)]
            params = SamplingParams(
                max_tokens=rng.randrange(1, 5), temperature=rng.choice([0.0, 0.8]), seed=i
            )
            engine.add_request(rid, {"prompt_token_ids": prompt}, params)
            mine.append(rid)
            with book:
                added.add(rid)
            if rng.random() < 0.2:
                victim = rng.choice(mine)
                engine.abort_request(victim)
                with book:
                    aborted.add(victim)

    threads = [threading.Thread(target=add, args=(w,)) for w in range(adders)]
    finished: dict[str, str | None] = {}
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave the threads finely
    try:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads) or engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    assert out.request_id not in finished, "finished twice"
                    finished[out.request_id] = out.outputs[0].finish_reason
    finally:
        sys.setswitchinterval(interval)
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    assert len(added) == adders * per_adder
    assert not engine.has_unfinished_requests() and not engine.states
    assert engine.scheduler.num_free_blocks == engine.num_blocks - 1  # every block back
    assert set(finished) | aborted == added  # none lost
    assert set(finished.values()) <= {"length", "stop"}  # EOS (id 2) may be drawn
