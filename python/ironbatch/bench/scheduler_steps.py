"""Time schedule() + update_from_output() per step (wall-clock,
``time.perf_counter``), for any scheduler that a driver wraps:

- ``decode-N``: N requests all decoding (one token each per step), timed in
  steady state;
- ``mixed``: 224 requests with 512-token prompts queued at once and two more
  arriving per step (64 output tokens each, a 2,048-token budget). Its timed
  steps follow 21 warm-up steps and are the ramp: running requests grow from
  ~90 to ~235 while the queue drains, each step a full budget of prefill
  chunks beside the decodes.

Drivers take turns, ``turn`` steps each (1: strict alternation, so each
step starts with caches the other drivers just used, as an engine's
scheduler does after a model step; larger: mostly warm steps), and every
step is timed. The report is the median per step and ratios to the first
driver.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ironbatch.config import CacheConfig, KVCacheGroup, SchedulerConfig
from ironbatch.lora import LoRARequest
from ironbatch.multimodal import MultimodalInput
from ironbatch.request import Request
from ironbatch.sampling_params import SamplingParams
from ironbatch.scheduler import Scheduler

TOKEN = 5


#: Recurrent-state groups per KV-cache layout (Workload.kv_layout).
RECURRENT_GROUPS = {"qwen3-next": 3, "jamba": 1}


@dataclass(frozen=True)
class Workload:
    name: str
    max_num_seqs: int
    max_num_batched_tokens: int
    initial_requests: int  # added before the first step
    prompt_len: int
    arrivals_per_step: int = 0
    max_tokens: int = 100_000  # decode requests run for the whole benchmark
    max_model_len: int = 8192
    block_size: int = 16
    # vLLM-interface features (the drop-in and vLLM's scheduler; the core's
    # own drivers run the plain workload): every n-th request uses a JSON
    # schema (0: none), and KV-cache events are published.
    structured_every: int = 0
    kv_events: bool = False
    # n-gram speculative decoding with this many drafts a step (0: off); the
    # runner accepts 0, 1, ..., k of them in turn.
    num_speculative_tokens: int = 0
    # The KV-cache groups: "full" (one group), "gpt-oss" (a sliding window
    # of `window` tokens, then full attention, as vLLM groups gpt-oss), or
    # with recurrent states: "qwen3-next" (three linear-attention groups,
    # then full attention), "jamba" (a Mamba group, then full attention);
    # states of max_model_len tokens with prefix caching off, or with
    # `cached_states` of the block size, prefix caching on (vLLM's
    # mamba_cache_mode "align").
    kv_layout: str = "full"
    window: int = 128
    cached_states: bool = False
    # LoRA: request i takes adapter i % lora_adapters + 1 (0: none), at most
    # max_loras of them in a step's batch; the rest wait, skipped each step.
    lora_adapters: int = 0
    max_loras: int | None = None
    # Images: request i carries 1 + i % images_per_request of them (0: none),
    # each `image_tokens` placeholders; every fourth request's first image is
    # one shared by all of those (the encoder cache serves it). The encoder's
    # budget and cache are vLLM's defaults: max_num_batched_tokens each.
    images_per_request: int = 0
    image_tokens: int = 128
    # A P/D decode instance: every prompt's KV was computed by a prefill
    # instance and arrives asynchronously (NIXL for vLLM and the drop-in; a
    # connector with NIXL's answers for the core), reported loaded by the
    # step that asked for it.
    remote_prefill: bool = False
    # CPU offloading (vLLM's OffloadingConnector, --kv-offloading-size) under
    # KV pressure: the GPU cache holds `gpu_blocks` blocks, so requests are
    # preempted and load their stored blocks back from CPU memory. Only the
    # drop-in and vLLM run it (the connector is vLLM's object).
    cpu_offload: bool = False
    gpu_blocks: int | None = None

    @property
    def num_groups(self) -> int:
        """Attention groups."""
        return 2 if self.kv_layout == "gpt-oss" else 1

    @property
    def num_recurrent_groups(self) -> int:
        return RECURRENT_GROUPS.get(self.kv_layout, 0)

    @property
    def prefix_caching(self) -> bool:
        """Recurrent layouts run without unless their states are cached
        (vLLM's "align" mode)."""
        return self.num_recurrent_groups == 0 or self.cached_states

    @property
    def num_blocks(self) -> int:
        if self.gpu_blocks is not None:
            return self.gpu_blocks
        per_request = -(-self.max_model_len // self.block_size)
        # One state block each, or with cached states the two a step holds.
        held = 2 if self.cached_states else 1
        states = self.num_recurrent_groups * self.max_num_seqs * held
        return self.num_groups * self.max_num_seqs * per_request + states + 1

    def kv_cache_groups(self, async_scheduling: bool) -> tuple[KVCacheGroup, ...] | None:
        """The groups as the core takes them, the window's admission cap as
        vLLM computes it (one step in flight, two with async scheduling)."""
        if self.kv_layout == "full":
            return None
        if self.num_recurrent_groups:
            size = self.block_size if self.cached_states else self.max_model_len
            state = KVCacheGroup(kind="mamba", size=size)
            return (state,) * self.num_recurrent_groups + (KVCacheGroup(kind="full"),)
        in_flight = (2 if async_scheduling else 1) * self.max_num_batched_tokens
        tokens = min(self.window - 1 + in_flight, self.max_model_len)
        cap = -(-tokens // self.block_size) + 1
        window = KVCacheGroup(kind="sliding_window", size=self.window, admission_cap_blocks=cap)
        return (window, KVCacheGroup(kind="full"))

    @property
    def encoder_budget(self) -> int | None:
        """The encoder's compute budget and cache size (None: text)."""
        return self.max_num_batched_tokens if self.images_per_request else None

    def images(self, i: int) -> list[MultimodalInput]:
        """Request i's images, spread over its prompt."""
        if not self.images_per_request:
            return []
        n = 1 + i % self.images_per_request
        gap = self.prompt_len // n
        return [
            MultimodalInput(
                k * gap + 8,
                self.image_tokens,
                "shared" if k == 0 and i % 4 == 0 else f"img-{i}-{k}",
            )
            for k in range(n)
        ]

    def request(self, i: int) -> Request:
        # Distinct prompts (no prefix sharing): the cost of the scheduling
        # itself, not of cache hits.
        prompt = [(i * 7919 + k) % 30000 + 3 for k in range(self.prompt_len)]
        images = self.images(i)
        for m in images:
            prompt[m.offset : m.offset + m.length] = [TOKEN] * m.length
        adapter = i % self.lora_adapters + 1 if self.lora_adapters else None
        return Request(
            f"req-{i}",
            prompt,
            SamplingParams(max_tokens=self.max_tokens, ignore_eos=True),
            eos_token_id=2,
            arrival_time=float(i),
            lora_request=None
            if adapter is None
            else LoRARequest(f"adapter-{adapter}", adapter, f"/adapters/{adapter}"),
            mm_features=images or None,
        )


def arriving(kind: str, n: int, **features: Any) -> Workload:
    """``kind-n``: n running at most, 7n/8 requests at the start and n/64
    arriving every step (as many as finish), 512-token prompts, 64 output
    tokens each, with ``features``."""
    return Workload(
        f"{kind}-{n}",
        n,
        2048,
        n * 7 // 8,
        512,
        arrivals_per_step=n // 64,
        max_tokens=64,
        max_model_len=2048,
        **features,
    )


WORKLOADS = {
    w.name: w
    for w in [
        Workload("decode-64", 64, 2048, 64, 32),
        Workload("decode-256", 256, 2048, 256, 32),
        Workload("decode-1024", 1024, 8192, 1024, 32),
        Workload(
            "mixed", 256, 2048, 224, 512, arrivals_per_step=2, max_tokens=64, max_model_len=2048
        ),
        Workload("json-64", 64, 2048, 64, 32, structured_every=3),
        Workload("json-256", 256, 2048, 256, 32, structured_every=3),
        Workload("kv-events-64", 64, 2048, 64, 32, kv_events=True),
        Workload("kv-events-256", 256, 2048, 256, 32, kv_events=True),
        Workload("ngram3-64", 64, 2048, 64, 32, num_speculative_tokens=3),
        Workload("ngram3-256", 256, 2048, 256, 32, num_speculative_tokens=3),
        Workload("ngram5-64", 64, 2048, 64, 32, num_speculative_tokens=5),
        Workload("ngram5-256", 256, 2048, 256, 32, num_speculative_tokens=5),
        # gpt-oss's KV cache (a 128-token window beside full attention) at
        # 4k-token contexts: every decode gives a window block back now and
        # then, and takes blocks for both groups.
        Workload("gpt-oss-64", 64, 8192, 64, 4096, kv_layout="gpt-oss"),
        Workload("gpt-oss-256", 256, 8192, 256, 4096, kv_layout="gpt-oss"),
        # Qwen3-Next's and Jamba's KV caches (recurrent states beside full
        # attention, prefix caching off) at 4k-token contexts: a state block
        # per group and request, taken once; attention blocks to zero.
        *(
            Workload(f"{layout}-{n}", n, 8192, n, 4096, kv_layout=layout)
            for layout in ("qwen3-next", "jamba")
            for n in (64, 256)
        ),
        # The same with prefix caching on (vLLM's default, mamba_cache_mode
        # "align"): a state block per group every 16 tokens, the one before
        # freed, chunks aligned to blocks.
        *(
            Workload(f"{layout}-align-{n}", n, 8192, n, 4096, kv_layout=layout, cached_states=True)
            for layout in ("qwen3-next", "jamba")
            for n in (64, 256)
        ),
        # 8 adapters, 4 a batch: half the requests run (decoding), the other
        # half wait and are skipped by every step's waiting pass.
        Workload("lora-64", 64, 2048, 128, 32, lora_adapters=8, max_loras=4),
        Workload("lora-256", 256, 2048, 512, 32, lora_adapters=8, max_loras=4),
        # A vision model: 1 to 3 images of 128 placeholders per prompt, so
        # every step encodes some, cuts chunks before others and frees the
        # cache.
        *(arriving("vision", n, images_per_request=3) for n in (64, 256)),
        # A P/D decode instance: every prompt was prefilled elsewhere; each
        # request waits for its KV, decodes and goes, so every step admits
        # loads, settles them and frees.
        *(arriving("pd-decode", n, remote_prefill=True) for n in (64, 256)),
        # CPU offloading under KV pressure: the GPU cache holds about two
        # thirds of what the running requests need, so the running pass
        # preempts; a preempted request's computed blocks were stored to CPU
        # memory as they filled and load back when it is readmitted.
        *(arriving("offload", n, cpu_offload=True, gpu_blocks=n * 36 * 2 // 3) for n in (64, 256)),
    ]
}


class RemotePrefill:
    """A decode instance's connector, as the core calls one: every prompt's
    KV (all but the tokens already hit locally) arrives asynchronously, as
    NIXL answers for a request with ``do_remote_prefill``; ``started``
    collects the loads a step starts, for the worker to report done."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def get_num_new_matched_tokens(
        self, request_id: str, num_tokens: int, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        left = num_tokens - num_computed_tokens
        return (left, True) if left > 0 else (0, False)

    def update_state_after_alloc(
        self, request_id: str, block_ids: list[list[int]], num_external_tokens: int
    ) -> None:
        if num_external_tokens:
            self.started.append(request_id)

    def request_finished(self, request_id: str, block_ids: list[list[int]], status: str) -> bool:
        return False


class LoadsDone:
    """A worker's report: these loads are done (KVConnectorOutput's fields)."""

    def __init__(self, request_ids: list[str]) -> None:
        self.finished_recving = request_ids
        self.finished_sending: list[str] = []
        self.failed_recving: list[str] = []
        self.invalid_block_ids: list[int] = []


class Driver(Protocol):
    name: str

    def add(self, request: Request) -> None: ...

    def step(self) -> float:
        """Run one step; return the seconds spent in the scheduler."""
        ...

    def is_steady(self) -> bool:
        """Whether every initial request is past its prefill."""
        ...


class TimedDriver:
    """One timed step, for any scheduler: ``schedule()``, the model runner's
    part (not timed), then ``update_from_output()`` — under async scheduling
    for the previous step, whose output arrives after this ``schedule()``,
    as in vLLM's engine. Subclasses say how to call their scheduler."""

    name: str

    def __init__(self, async_scheduling: bool) -> None:
        self.async_scheduling = async_scheduling
        self.pending: tuple[Any, Any] | None = None  # async: the step in flight
        self.last_prefill_rows = -1

    def step(self) -> float:
        t0 = time.perf_counter()
        out = self.schedule()
        t1 = time.perf_counter()
        result = self.run_model(out)
        self.last_prefill_rows = self.prefill_rows(out)
        if self.async_scheduling:
            (out, result), self.pending = self.pending or (None, None), (out, result)
        t2 = time.perf_counter()
        if out is not None:
            self.update(out, result)
        t3 = time.perf_counter()
        return (t1 - t0) + (t3 - t2)

    def is_steady(self) -> bool:
        return self.last_prefill_rows == 0

    def schedule(self) -> Any:
        raise NotImplementedError

    def run_model(self, out: Any) -> Any:
        """The model runner's part: what it returns for the step."""
        raise NotImplementedError

    def prefill_rows(self, out: Any) -> int:
        """Rows of the step still prefilling (more than one token)."""
        raise NotImplementedError

    def update(self, out: Any, result: Any) -> None:
        raise NotImplementedError


class IronbatchDriver(TimedDriver):
    """``ironbatch.Scheduler`` on one backend, fed aligned token arrays as a
    model runner would."""

    def __init__(self, workload: Workload, backend: str, async_scheduling: bool = False) -> None:
        super().__init__(async_scheduling)
        self.name = f"ironbatch-{backend}"
        self.sched = Scheduler(
            SchedulerConfig(
                max_model_len=workload.max_model_len,
                max_num_seqs=workload.max_num_seqs,
                max_num_batched_tokens=workload.max_num_batched_tokens,
                async_scheduling=async_scheduling,
                max_loras=workload.max_loras,
                encoder_compute_budget=workload.encoder_budget,
                encoder_cache_size=workload.encoder_budget,
            ),
            CacheConfig(
                num_blocks=workload.num_blocks,
                block_size=workload.block_size,
                enable_prefix_caching=workload.prefix_caching,
                kv_cache_groups=workload.kv_cache_groups(async_scheduling),
            ),
            backend=backend,
        )
        self.remote: RemotePrefill | None = None
        if workload.remote_prefill:
            self.remote = RemotePrefill()
            # A consumer with two steps in flight fences its frees, as vLLM.
            self.sched.set_kv_connector(self.remote, defer_block_free=async_scheduling)

    def add(self, request: Request) -> None:
        self.sched.add_request(request)

    def schedule(self) -> Any:
        return self.sched.schedule()

    def run_model(self, out: Any) -> Any:
        tokens = np.where(out.samples, TOKEN, -1)
        if self.remote is None:
            return tokens
        # The loads this step started are done by its end.
        loads, self.remote.started = self.remote.started, []
        return tokens, LoadsDone(loads)

    def prefill_rows(self, out: Any) -> int:
        return int(np.count_nonzero(out.num_scheduled > 1))

    def update(self, out: Any, result: Any) -> None:
        if self.remote is None:
            self.sched.update_from_output(out, result)
        else:
            tokens, loads = result
            self.sched.update_from_output(out, tokens, kv_connector_output=loads)


def run(
    drivers: Sequence[Callable[[Workload], Driver]],
    workloads: Sequence[Workload],
    steps: int = 100,
    turn: int = 1,
    log: Callable[[str], None] = lambda s: None,
) -> list[dict[str, Any]]:
    """For each workload: build every driver, bring it to steady state, then
    time ``steps`` steps per driver, the drivers taking turns of ``turn``
    consecutive steps."""
    rows = []
    for w in workloads:
        built = [make(w) for make in drivers]
        next_id = 0
        for d in built:
            for i in range(w.initial_requests):
                d.add(w.request(i))
        next_id = w.initial_requests
        for _ in range(10_000):  # warm up: every initial request prefilled
            for d in built:
                d.step()
            if all(d.is_steady() for d in built) or w.arrivals_per_step:
                break
        for _ in range(20 if w.arrivals_per_step else 0):  # reach a steady mix
            for i in range(w.arrivals_per_step):
                for d in built:
                    d.add(w.request(next_id + i))
            next_id += w.arrivals_per_step
            for d in built:
                d.step()
        times: dict[str, list[float]] = {d.name: [] for d in built}
        for _ in range(-(-steps // turn)):
            for d in built:
                ids = next_id
                for _ in range(turn):
                    for i in range(w.arrivals_per_step):
                        d.add(w.request(ids + i))
                    ids += w.arrivals_per_step
                    times[d.name].append(d.step())
            next_id = ids
        medians = {name: statistics.median(ts) for name, ts in times.items()}
        rows.append({"workload": w.name, "medians": medians})
        log(f"{w.name}: " + ", ".join(f"{n} {m * 1e6:,.1f} µs" for n, m in medians.items()))
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table: median µs per step, and each driver's time as a
    multiple of the first driver's."""
    names = list(rows[0]["medians"])
    base = names[0]
    head = "| workload | " + " | ".join(f"{n} (µs/step)" for n in names)
    head += " | " + " | ".join(f"{n} / {base}" for n in names[1:]) + " |"
    lines = [head, "|---" * (1 + 2 * len(names) - 1) + "|"]
    for r in rows:
        m = r["medians"]
        cells = [f"{m[n] * 1e6:,.1f}" for n in names]
        cells += [f"{m[n] / m[base]:,.1f}×" for n in names[1:]]
        lines.append(f"| {r['workload']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
