"""Scheduler settings (docs/scheduling.md §2), resolved and validated like
vLLM's: the twin of ``rust/src/scheduler_config.rs``."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ironbatch.reference.attention_group import (
    FULL,
    ChunkedLocal,
    CrossAttention,
    Full,
    GroupSpec,
    Mamba,
    SlidingWindow,
)
from ironbatch.reference.error import debug_str
from ironbatch.reference.kv_cache_manager import check_groups
from ironbatch.reference.kv_cache_manager.config import (
    hash_block_size,
    validate_group_block_sizes,
)
from ironbatch.reference.limits import (
    MAX_BLOCK_SIZE,
    MAX_KV_CACHE_GROUPS,
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_BLOCKS,
    MAX_NUM_SEQS,
    check_range,
)


class Policy(enum.Enum):
    """Which waiting request goes first, and who is preempted."""

    #: First come, first served; the last running request is the victim.
    FCFS = "fcfs"
    #: Smallest (priority, arrival_time, id) first; the largest
    #: (priority, arrival_time) running request is the victim.
    PRIORITY = "priority"


class Runner(enum.Enum):
    """What the model does with a step's output (vLLM's ``--runner``)."""

    #: Samples one token per step after the prompt (plus accepted drafts).
    GENERATE = "generate"
    #: Pools the prompt's hidden states and finishes: no token is sampled,
    #: so no position is held back for one (§4.16).
    POOLING = "pooling"
    #: Runs the multimodal encoder alone (vLLM's ``--mm-encoder-only``, the
    #: producer of disaggregated encoding): nothing is sampled, and each
    #: request finishes once its whole prompt is consumed; a prompt over the
    #: step's budget is chunked even with chunked prefill off (§4.18).
    ENCODER_ONLY = "encoder_only"

    def sampled_tokens_per_step(self) -> int:
        """Tokens a request appends per step beyond its drafts (vLLM's
        ``num_sampled_tokens_per_step``): the room a step leaves below
        ``max_model_len`` and the placeholders async scheduling adds (vLLM
        counts an encoder-only deployment as generating)."""
        return 0 if self is Runner.POOLING else 1


@dataclass(frozen=True)
class EncoderConfig:
    """The encoder's limits (vLLM's ``MultiModalBudget``), in embeddings."""

    #: Embeddings the encoder may compute in one step (vLLM's
    #: ``encoder_compute_budget``: at least one largest item).
    compute_budget: int
    #: Embeddings the encoder cache holds (at least one largest item).
    cache_size: int
    #: Never split an item's placeholders across steps.
    disable_chunked_mm_input: bool = False


@dataclass(frozen=True)
class SchedulerSettings:
    """What the scheduler runs with, every optional setting resolved: the
    twin of the core's ``SchedulerConfig`` struct, field for field. Both
    backends get theirs from ``settings`` (the rust one through the
    binding), so a default is resolved in one place."""

    max_num_seqs: int
    #: The step's input budget: tokens the model runner takes in one step.
    max_num_batched_tokens: int
    #: The step's token budget (vLLM's ``max_num_scheduled_tokens``).
    max_num_scheduled_tokens: int
    #: Admissions stop once this many requests run (``max_num_active_seqs``).
    max_num_active_seqs: int
    max_model_len: int
    enable_chunked_prefill: bool
    #: Per-request per-step token cap; 0 = off.
    long_prefill_token_threshold: int
    #: Floor the cap at ``max_num_batched_tokens / unfinished requests``.
    long_prefill_token_threshold_adaptive: bool
    #: Blocks an admission must leave free while others run.
    watermark_blocks: int
    policy: Policy
    #: The full-prompt admission gate (docs/scheduling.md §7.6).
    scheduler_reserve_full_isl: bool
    #: vLLM's async scheduling (docs/scheduling.md §4.9).
    async_scheduling: bool
    #: Executed steps between prefill-carrying steps, locally; 1 is off
    #: (docs/scheduling.md §4.11).
    prefill_schedule_interval: int
    #: ``schedule()`` calls between a request's decode steps; 0 or 1 is off
    #: (vLLM's V2 runner, async, pipeline parallelism: the pipeline depth).
    decode_stagger: int
    #: Draft tokens a request may carry into a step (vLLM's
    #: ``num_speculative_tokens``; docs/scheduling.md §4.13).
    num_speculative_tokens: int
    #: Input tokens a drafter adds per scheduled request (vLLM's
    #: ``max_num_new_slots_for_drafting``), charged to the input budget.
    num_draft_slots: int
    #: Dynamic speculation lengths: entry ``b`` the drafts the runner
    #: proposes after a step of ``b`` requests; None: always
    #: ``num_speculative_tokens`` (and admissions padded to a draft step).
    drafts_by_batch_size: tuple[int, ...] | None
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool
    #: KV slots reserved past a request's scheduled tokens for a drafter with
    #: its own forward pass (vLLM's ``num_lookahead_tokens``).
    num_lookahead_tokens: int
    #: Tokens after each block that its hash covers (vLLM's
    #: ``num_hash_lookahead_tokens``, §7.4).
    num_hash_lookahead_tokens: int
    #: A prefix hit gives up its last block (vLLM's EAGLE block drop
    #: without lookahead hashes, §7.4).
    drop_eagle_block: bool
    #: The KV-cache groups, in vLLM's order; one full-attention group for
    #: most models.
    kv_cache_groups: tuple[GroupSpec, ...] = (FULL,)
    #: The groups whose hits give up an EAGLE block under ``drop_eagle_block``
    #: (vLLM's groups holding the drafter's layers); None: every group.
    eagle_groups: tuple[int, ...] | None = None
    #: Distinct LoRA adapters a step's batch may hold (vLLM's ``max_loras``,
    #: §4.14); None: no cap (vLLM's scheduler without a LoRA config checks
    #: none; adapters still key the hashes).
    max_loras: int | None = None
    #: Prompt tokens past a step's range that an EAGLE-style drafter reads
    #: (vLLM's ``num_prefill_lookahead_tokens``: 1 for EAGLE, EAGLE-3 and
    #: one MTP module, ``num_speculative_tokens`` for multi-module MTP, else
    #: 0; §4.13): the encoder inputs those fall in run in the step too;
    #: above 1, no prefill chunk ends within this many tokens of the
    #: prompt's end, and the last ``drafter_read_ahead - 1`` computed tokens
    #: are not hash cached.
    drafter_read_ahead: int = 0
    #: The encoder's limits, for a model that takes images or audio (§4.15);
    #: None: a text model, which refuses multimodal inputs.
    encoder: EncoderConfig | None = None
    runner: Runner = Runner.GENERATE
    #: Sliding-window groups cache only the blocks a later request can
    #: resume from (vLLM's ``prefix_cache_retention_interval = 0``, its
    #: default); False caches them all.
    sparse_retention: bool = True
    #: Under sparse retention, window groups also cache each segment's
    #: tail, segments of this many tokens (vLLM's
    #: ``prefix_cache_retention_interval`` above 0); 0 for none.
    retention_interval: int = 0
    #: The attention groups' KV has mixed precisions: new blocks are listed
    #: for zeroing (vLLM's ``has_mixed_precision_kv_cache``).
    mixed_precision: bool = False


def settings(scheduler_config: Any, cache_config: Any) -> SchedulerSettings:
    """Resolve the API's ``SchedulerConfig`` and ``CacheConfig`` (read by
    attribute) as vLLM resolves them: the token budget and the admission cap
    default to ``max_num_batched_tokens`` and ``max_num_seqs``; the
    watermark, a fraction of all blocks, becomes ``int(watermark *
    num_blocks)`` blocks."""
    c = scheduler_config
    scheduled = getattr(c, "max_num_scheduled_tokens", None)
    active = getattr(c, "max_num_active_seqs", None)
    num_blocks = cache_config.num_blocks
    return SchedulerSettings(
        max_num_seqs=c.max_num_seqs,
        max_num_batched_tokens=c.max_num_batched_tokens,
        max_num_scheduled_tokens=c.max_num_batched_tokens if scheduled is None else scheduled,
        max_num_active_seqs=c.max_num_seqs if active is None else active,
        max_model_len=c.max_model_len,
        enable_chunked_prefill=c.enable_chunked_prefill,
        long_prefill_token_threshold=c.long_prefill_token_threshold,
        long_prefill_token_threshold_adaptive=getattr(
            c, "long_prefill_token_threshold_adaptive", False
        ),
        watermark_blocks=int(getattr(c, "watermark", 0.0) * num_blocks),
        policy=Policy(c.policy) if c.policy in ("fcfs", "priority") else c.policy,
        scheduler_reserve_full_isl=c.scheduler_reserve_full_isl,
        async_scheduling=c.async_scheduling,
        prefill_schedule_interval=getattr(c, "prefill_schedule_interval", 1),
        decode_stagger=getattr(c, "decode_stagger", 0),
        num_speculative_tokens=getattr(c, "num_speculative_tokens", 0),
        num_draft_slots=getattr(c, "num_draft_slots", 0),
        drafts_by_batch_size=getattr(c, "drafts_by_batch_size", None),
        num_blocks=num_blocks,
        block_size=cache_config.block_size,
        enable_prefix_caching=cache_config.enable_prefix_caching,
        num_lookahead_tokens=getattr(c, "num_lookahead_tokens", 0),
        num_hash_lookahead_tokens=getattr(c, "num_hash_lookahead_tokens", 0),
        drop_eagle_block=getattr(c, "drop_eagle_block", False),
        eagle_groups=getattr(c, "eagle_groups", None),
        kv_cache_groups=group_specs(getattr(cache_config, "kv_cache_groups", None)),
        max_loras=getattr(c, "max_loras", None),
        drafter_read_ahead=getattr(c, "drafter_read_ahead", 0),
        encoder=encoder_config(c),
        runner=runner_named(getattr(c, "runner", "generate")),
        sparse_retention=getattr(cache_config, "sparse_retention", True),
        retention_interval=getattr(cache_config, "retention_interval", 0),
        mixed_precision=getattr(cache_config, "mixed_precision", False),
    )


def runner_named(name: Any) -> Runner:
    """The API's ``runner`` string as the twin's enum, refused as the
    binding refuses it."""
    for r in Runner:
        if name == r.value:
            return r
    raise ValueError(
        f"runner must be 'generate', 'pooling' or 'encoder_only', got {debug_str(str(name))}"
    )


def encoder_config(c: Any) -> EncoderConfig | None:
    """The API's encoder settings (read by attribute): None for a text model
    (no ``encoder_compute_budget``). A budget needs a cache size, as the
    binding requires."""
    budget = getattr(c, "encoder_compute_budget", None)
    if budget is None:
        return None
    size = getattr(c, "encoder_cache_size", None)
    if size is None:
        raise ValueError(
            "encoder_compute_budget and encoder_cache_size go together: give both "
            "(a multimodal model) or neither (a text model)"
        )
    return EncoderConfig(
        compute_budget=budget,
        cache_size=size,
        disable_chunked_mm_input=getattr(c, "disable_chunked_mm_input", False),
    )


#: The API's group kinds (``KVCacheGroup.kind``), as the binding names them.
GROUP_KINDS = ("full", "sliding_window", "chunked_local", "cross_attention", "mamba")


def group_specs(groups: Any) -> tuple[GroupSpec, ...]:
    """The API's ``kv_cache_groups`` (``kind``, ``size``,
    ``admission_cap_blocks``, ``speculative_blocks``,
    ``prefill_checkpoint_alignment``, ``block_size`` read by attribute) as
    the core's groups; None is one full-attention group. An unknown kind is refused as the binding
    refuses it."""
    if groups is None:
        return (FULL,)
    out = []
    for g in groups:
        cap = g.admission_cap_blocks
        own = getattr(g, "block_size", None)
        if g.kind == "full":
            out.append(GroupSpec(Full(), cap, own))
        elif g.kind == "sliding_window":
            out.append(GroupSpec(SlidingWindow(g.size), cap, own))
        elif g.kind == "chunked_local":
            out.append(GroupSpec(ChunkedLocal(g.size), cap, own))
        elif g.kind == "cross_attention":
            out.append(GroupSpec(CrossAttention(), cap, own))
        elif g.kind == "mamba":
            alignment = g.prefill_checkpoint_alignment
            out.append(GroupSpec(Mamba(g.size, g.speculative_blocks, alignment), cap))
        else:
            raise ValueError(
                "kv_cache_groups kind must be 'full', 'sliding_window', 'chunked_local', "
                f"'cross_attention' or 'mamba', got {debug_str(str(g.kind))}"
            )
    return tuple(out)


def validate(c: SchedulerSettings) -> None:
    """Check every rule of docs/scheduling.md §2, naming the first field
    that breaks one (the core's order: the cache's fields first). Whether
    the cache holds one ``max_model_len`` sequence is the engine's start-up
    check (``ironbatch.config.check_fits``), not the scheduler's: vLLM's
    scheduler runs with whatever cache it is given."""
    # The binding reads the policy before the core checks the sizes.
    if not isinstance(c.policy, Policy):
        raise ValueError(f"policy must be 'fcfs' or 'priority', got {debug_str(str(c.policy))}")
    check_range("block_size", c.block_size, 1, MAX_BLOCK_SIZE)
    check_range("max_model_len", c.max_model_len, 1, MAX_MODEL_LEN)
    # Without a KV cache, vLLM's pool is the null block alone.
    check_range("num_blocks", c.num_blocks, 1 if not c.kv_cache_groups else 2, MAX_NUM_BLOCKS)
    check_range("num_lookahead_tokens", c.num_lookahead_tokens, 0, c.max_model_len)
    check_range("kv_cache_groups", len(c.kv_cache_groups), 0, MAX_KV_CACHE_GROUPS)
    validate_group_block_sizes(
        c.kv_cache_groups, c.block_size, c.drop_eagle_block, c.enable_prefix_caching
    )
    check_range(
        "num_hash_lookahead_tokens",
        c.num_hash_lookahead_tokens,
        0,
        hash_block_size(c.kv_cache_groups, c.block_size, c.enable_prefix_caching),
    )
    check_groups(
        c.kv_cache_groups,
        c.num_hash_lookahead_tokens,
        c.enable_prefix_caching,
        c.drop_eagle_block,
        sparse_retention=c.sparse_retention,
        retention_interval=c.retention_interval,
        block_size=c.block_size,
        eagle_groups=c.eagle_groups,
    )
    check_scheduler(c)
    check_range("max_num_scheduled_tokens", c.max_num_scheduled_tokens, 1, MAX_NUM_BATCHED_TOKENS)
    check_range("max_num_active_seqs", c.max_num_active_seqs, 1, c.max_num_seqs)
    check_range("watermark_blocks", c.watermark_blocks, 0, c.num_blocks - 1)
    check_range("prefill_schedule_interval", c.prefill_schedule_interval, 1, MAX_NUM_SEQS)
    check_range("decode_stagger", c.decode_stagger, 0, MAX_NUM_SEQS)
    check_range("num_speculative_tokens", c.num_speculative_tokens, 0, c.max_model_len)
    check_range("num_draft_slots", c.num_draft_slots, 0, c.num_speculative_tokens)
    table = c.drafts_by_batch_size
    if table is not None:
        if c.num_speculative_tokens == 0 or len(table) != c.max_num_seqs + 1:
            raise ValueError(
                "drafts_by_batch_size needs speculative decoding and max_num_seqs + 1 = "
                f"{c.max_num_seqs + 1} entries, got {len(table)}"
            )
        for k in table:
            if k > c.num_speculative_tokens:
                raise ValueError(
                    f"drafts_by_batch_size: {k} drafts is more than num_speculative_tokens "
                    f"({c.num_speculative_tokens})"
                )
    # An EAGLE-style drafter reads one token ahead; multi-module MTP one per module.
    check_range("drafter_read_ahead", c.drafter_read_ahead, 0, max(c.num_speculative_tokens, 1))
    if c.max_loras is not None:
        check_range("max_loras", c.max_loras, 1, MAX_NUM_SEQS)
    if c.encoder is not None:
        e = c.encoder
        check_range("encoder_compute_budget", e.compute_budget, 1, MAX_NUM_BATCHED_TOKENS)
        check_range("encoder_cache_size", e.cache_size, 1, MAX_MODEL_LEN)
    if any(g.kind.is_cross() for g in c.kv_cache_groups) and c.encoder is None:
        # Cross-attention blocks are taken when the encoder input runs.
        raise ValueError(
            "a cross-attention KV-cache group (an encoder-decoder model) needs an encoder: "
            "configure its encoder budget and cache size"
        )
    caches_states = c.enable_prefix_caching and any(
        g.kind.is_recurrent() for g in c.kv_cache_groups
    )
    if caches_states and not c.enable_chunked_prefill:
        # A prompt's states are cached at the ends of its chunks (vLLM
        # asserts the same).
        raise ValueError(
            "enable_chunked_prefill must be true with prefix caching over a Mamba KV-cache "
            "group (vLLM's mamba_cache_mode 'align')"
        )
    if c.runner is not Runner.GENERATE and c.num_speculative_tokens > 0:
        # vLLM builds no drafter for a pooling model or an encoder alone.
        raise ValueError(
            f"num_speculative_tokens ({c.num_speculative_tokens}) must be 0 for runner "
            f"'{c.runner.value}': it samples no tokens to verify drafts against"
        )
    if c.runner is Runner.ENCODER_ONLY and c.encoder is None:
        raise ValueError(
            "runner 'encoder_only' runs a multimodal encoder: configure its encoder budget "
            "and cache size"
        )


def check_scheduler(c: Any) -> None:
    """The scheduler's own rules, over its fields alone (the API's
    ``SchedulerConfig`` runs these too)."""
    check_range("max_num_seqs", c.max_num_seqs, 1, MAX_NUM_SEQS)
    check_range("max_model_len", c.max_model_len, 2, MAX_MODEL_LEN)
    check_range("max_num_batched_tokens", c.max_num_batched_tokens, 1, MAX_NUM_BATCHED_TOKENS)
    if c.max_num_batched_tokens < c.max_num_seqs:
        raise ValueError(
            f"max_num_batched_tokens ({c.max_num_batched_tokens}) must be >= "
            f"max_num_seqs ({c.max_num_seqs})"
        )
    # An encoder-only runner chunks regardless: vLLM's engine turns chunked
    # prefill off for it (it has no KV cache) after checking.
    runner = getattr(c, "runner", Runner.GENERATE)  # the API's string, or the twin's enum
    encoder_only = runner in (Runner.ENCODER_ONLY, Runner.ENCODER_ONLY.value)
    whole_prompts = not c.enable_chunked_prefill and not encoder_only
    if whole_prompts and c.max_num_batched_tokens < c.max_model_len:
        raise ValueError(
            f"max_num_batched_tokens ({c.max_num_batched_tokens}) must be >= "
            f"max_model_len ({c.max_model_len}) when chunked prefill is off"
        )
    if c.long_prefill_token_threshold > c.max_model_len:
        raise ValueError(
            f"long_prefill_token_threshold ({c.long_prefill_token_threshold}) must be <= "
            f"max_model_len ({c.max_model_len})"
        )
