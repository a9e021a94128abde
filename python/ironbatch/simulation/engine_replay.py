"""A workload on the real engine, arrivals on the wall clock: what the
simulator's fidelity is measured against. Requests are added between steps
once their arrival time has passed (as a server's engine loop takes them),
and every step's outputs are stamped when the step returns, so TTFT and E2E
mean what they mean in the simulator. Between arrivals the loop polls the
clock rather than sleeping (see below)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from ironbatch.simulation.workload import Workload

CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def replay_on_engine(engine: Any, workload: Workload, clock: str = "wall") -> dict[str, np.ndarray]:
    """Run ``workload`` through ``engine`` (an ``LLMEngine``) in real time;
    per request: arrival, first-token and finish times (seconds from the
    start) and tokens generated.

    ``clock="thread"`` runs the arrivals and the stamps on this thread's CPU
    time instead of the wall clock: on a dedicated machine the two are the
    same for a CPU engine (the loop polls, so it always has the core), while
    on a shared one the thread clock leaves out the time other processes
    took the core, the one thing no step model of this engine can know. It
    needs a step model fitted on the same clock (``ironbatch profile``'s
    ``clock="cpu"``) and a single-threaded engine (``torch.set_num_threads(1)``);
    on a GPU use the wall clock."""
    from ironbatch.sampling_params import SamplingParams

    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    now_s = CLOCKS[clock]
    vocab = engine.model_config.vocab_size
    if workload.vocab_size > vocab:
        workload = replace(workload, vocab_size=vocab)
    n = len(workload)
    prompts = [{"prompt_token_ids": workload.prompt_token_ids(i)} for i in range(n)]
    params = [SamplingParams(max_tokens=int(m), ignore_eos=True) for m in workload.output_tokens]
    arrival = workload.arrival_s.tolist()
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    produced = np.zeros(n, dtype=np.int64)
    busy_s = busy_cpu_s = 0.0
    start = now_s()
    i = 0
    while i < n or engine.has_unfinished_requests():
        now = now_s() - start
        while i < n and arrival[i] <= now:
            engine.add_request(str(i), prompts[i], params[i])
            i += 1
        if not engine.has_unfinished_requests():
            # Poll, not sleep: a sleeping engine's core (and its caches) goes
            # to other processes, and on a shared CPU the next step then runs
            # cold, slower than any profile of back-to-back steps says.
            while now_s() - start < arrival[i]:
                pass
            continue
        t0, c0 = time.perf_counter(), time.thread_time()
        outputs = engine.step()
        busy_cpu_s += time.thread_time() - c0
        busy_s += time.perf_counter() - t0
        t = now_s() - start
        for o in outputs:
            k = int(o.request_id)
            produced[k] += len(o.new_token_ids)
            if np.isnan(first[k]) and o.new_token_ids:
                first[k] = t
            if o.finished:
                finish[k] = t
    return {
        "arrival_s": workload.arrival_s.copy(),
        "first_token_s": first,
        "finish_s": finish,
        "output_tokens": produced,
        # Seconds inside step() on the wall clock and in this thread's CPU
        # time: their ratio is how much other processes slowed the engine.
        "busy_s": np.array([busy_s]),
        "busy_cpu_s": np.array([busy_cpu_s]),
    }
