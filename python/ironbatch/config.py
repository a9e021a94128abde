"""Scheduler and KV-cache settings (docs/scheduling.md §2), validated the way vLLM's are:
a ValueError naming the field and the value."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ironbatch.reference.block import cdiv
from ironbatch.reference.limits import (
    MAX_BLOCK_SIZE,
    MAX_KV_CACHE_GROUPS,
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_BLOCKS,
    MAX_NUM_SEQS,
    check_range,
)
from ironbatch.reference.scheduler_config import GROUP_KINDS, check_scheduler

POLICIES = ("fcfs", "priority")
RUNNERS = ("generate", "pooling", "encoder_only")


def _int(field: str, value: object, minimum: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field} must be an int, got {type(value).__name__}")
    check_range(field, value, minimum, maximum)


def _bool(field: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{field} must be a bool, got {type(value).__name__}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_model_len: int
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0 = off
    policy: str = "fcfs"
    # The full-prompt admission gate (docs/scheduling.md §7.6).
    scheduler_reserve_full_isl: bool = True
    # vLLM's async scheduling: the next step is scheduled before this one's
    # output arrives, with an output placeholder per token in flight.
    async_scheduling: bool = False
    # The token budget of a step, when it must differ from the input budget
    # max_num_batched_tokens (vLLM's max_num_scheduled_tokens).
    max_num_scheduled_tokens: int | None = None
    # Admit requests only while fewer than this many run (vLLM's
    # max_num_active_seqs, <= max_num_seqs): smaller decode batches.
    max_num_active_seqs: int | None = None
    # Floor long_prefill_token_threshold at max_num_batched_tokens divided by
    # the number of unfinished requests.
    long_prefill_token_threshold_adaptive: bool = False
    # Fraction of the KV cache an admission must leave free while others run.
    watermark: float = 0.0
    # Hold prefill work until this many executed steps have passed since the
    # last step that carried some (vLLM's prefill_schedule_interval; 1 = off),
    # so decodes run in longer stretches (docs/scheduling.md §4.11).
    prefill_schedule_interval: int = 1
    # schedule() calls between two decode steps of one request (vLLM's V2
    # runner with async scheduling and pipeline parallelism: the pipeline
    # depth); 0 or 1 = off.
    decode_stagger: int = 0
    # Draft tokens a request may carry into a step (vLLM's
    # num_speculative_tokens); 0 = no speculative decoding
    # (docs/scheduling.md §4.13).
    num_speculative_tokens: int = 0
    # What a drafter with its own forward pass (EAGLE, MTP, a draft model)
    # adds, as vLLM derives it from the speculative config: KV slots past each
    # request's scheduled tokens (num_lookahead_tokens), tokens after each
    # block that its hash covers (num_hash_lookahead_tokens; at most the block
    # size) and input slots per scheduled request (num_draft_slots, vLLM's
    # max_num_new_slots_for_drafting; at most num_speculative_tokens).
    num_lookahead_tokens: int = 0
    num_hash_lookahead_tokens: int = 0
    num_draft_slots: int = 0
    # An EAGLE-style drafter without lookahead hashes (vLLM's
    # use_eagle_block_drop, e.g. with disable_lookahead_block_hashes or a KV
    # connector): a prefix hit gives up its last block, whose draft KV read
    # a token the hit does not prove (docs/scheduling.md §7.4).
    drop_eagle_block: bool = False
    # The KV-cache groups whose hits drop that block (vLLM's groups holding
    # the drafter's layers, its is_eagle_group); None: every group (vLLM's
    # fallback when none is flagged). A group shares its kind's flag.
    eagle_groups: tuple[int, ...] | None = None
    # Dynamic speculation lengths (vLLM's num_speculative_tokens_per_batch_size,
    # docs/scheduling.md §4.13): entry b is how many drafts the runner proposes
    # after a step of b requests (entry 0 unused; max_num_seqs + 1 entries,
    # each at most num_speculative_tokens). Async scheduling then waits for
    # that many placeholders, and no admission is padded to a draft step.
    # None: always num_speculative_tokens.
    drafts_by_batch_size: tuple[int, ...] | None = None
    # Distinct LoRA adapters one step's batch may hold (vLLM's max_loras;
    # docs/scheduling.md §4.14): a request bringing one more waits. None =
    # no cap (adapters still key the prefix cache).
    max_loras: int | None = None
    # A multimodal model's encoder (vLLM's MultiModalBudget; docs/scheduling.md
    # §4.15), in embeddings: what one step may encode and what the encoder
    # cache holds. Both None = a text model, which refuses mm_features.
    encoder_compute_budget: int | None = None
    encoder_cache_size: int | None = None
    # Never split an item's placeholders across steps.
    disable_chunked_mm_input: bool = False
    # Prompt tokens past a step that an EAGLE-style drafter reads (vLLM's
    # num_prefill_lookahead_tokens: 1 for EAGLE, EAGLE-3 and one MTP module,
    # num_speculative_tokens for multi-module MTP): the encoder inputs they
    # fall in run in the step too; above 1, no prefill chunk ends within
    # that many tokens of the prompt's end, and the last drafter_read_ahead
    # - 1 computed tokens are not hash cached (docs/scheduling.md §4.13).
    drafter_read_ahead: int = 0
    # What the model does with a step (vLLM's --runner): "generate" samples a
    # token per step; "pooling" (embedding and classification models) pools
    # each prompt and finishes it, so a prompt may fill max_model_len and
    # results come back through update_from_pooler_output (§4.16);
    # "encoder_only" (vLLM's --mm-encoder-only) runs the multimodal encoder
    # alone, samples nothing and ends each request once its prompt is
    # consumed, chunking it even with chunked prefill off (§4.18).
    runner: str = "generate"

    def __post_init__(self) -> None:
        _int("max_model_len", self.max_model_len, 2, MAX_MODEL_LEN)
        _int("max_num_seqs", self.max_num_seqs, 1, MAX_NUM_SEQS)
        _int("max_num_batched_tokens", self.max_num_batched_tokens, 1, MAX_NUM_BATCHED_TOKENS)
        _int("long_prefill_token_threshold", self.long_prefill_token_threshold, 0, MAX_MODEL_LEN)
        _bool("enable_chunked_prefill", self.enable_chunked_prefill)
        _bool("scheduler_reserve_full_isl", self.scheduler_reserve_full_isl)
        _bool("async_scheduling", self.async_scheduling)
        _bool("long_prefill_token_threshold_adaptive", self.long_prefill_token_threshold_adaptive)
        if self.drafts_by_batch_size is not None:
            table = self.drafts_by_batch_size
            if isinstance(table, str) or not isinstance(table, Sequence):
                raise TypeError(
                    f"drafts_by_batch_size must be a sequence of ints, got {type(table).__name__}"
                )
            for i, k in enumerate(table):
                _int(f"drafts_by_batch_size[{i}]", k, 0, self.num_speculative_tokens)
        if self.max_num_scheduled_tokens is not None:
            _int(
                "max_num_scheduled_tokens", self.max_num_scheduled_tokens, 1, MAX_NUM_BATCHED_TOKENS
            )
        if self.max_num_active_seqs is not None:
            _int("max_num_active_seqs", self.max_num_active_seqs, 1, self.max_num_seqs)
        if isinstance(self.watermark, bool) or not isinstance(self.watermark, (int, float)):
            raise TypeError(f"watermark must be a float, got {type(self.watermark).__name__}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")
        _int("prefill_schedule_interval", self.prefill_schedule_interval, 1, MAX_NUM_SEQS)
        _int("decode_stagger", self.decode_stagger, 0, MAX_NUM_SEQS)
        _int("num_speculative_tokens", self.num_speculative_tokens, 0, self.max_model_len)
        _int("num_lookahead_tokens", self.num_lookahead_tokens, 0, self.max_model_len)
        _int("num_hash_lookahead_tokens", self.num_hash_lookahead_tokens, 0, MAX_BLOCK_SIZE)
        _int("num_draft_slots", self.num_draft_slots, 0, self.num_speculative_tokens)
        _bool("drop_eagle_block", self.drop_eagle_block)
        if self.drop_eagle_block and self.num_hash_lookahead_tokens:
            raise ValueError(
                "drop_eagle_block must be false with num_hash_lookahead_tokens above 0 "
                "(lookahead hashes prove the token after a block)"
            )
        if self.eagle_groups is not None:
            if not isinstance(self.eagle_groups, tuple | list):
                raise TypeError(
                    "eagle_groups must be a tuple of KV-cache group indices, got "
                    f"{type(self.eagle_groups).__name__}"
                )
            for g in self.eagle_groups:
                _int("eagle_groups", g, 0, MAX_KV_CACHE_GROUPS - 1)
        if self.max_loras is not None:
            _int("max_loras", self.max_loras, 1, MAX_NUM_SEQS)
        if (self.encoder_compute_budget is None) != (self.encoder_cache_size is None):
            raise ValueError(
                "encoder_compute_budget and encoder_cache_size go together: give both "
                "(a multimodal model) or neither (a text model)"
            )
        if self.encoder_compute_budget is not None and self.encoder_cache_size is not None:
            _int("encoder_compute_budget", self.encoder_compute_budget, 1, MAX_NUM_BATCHED_TOKENS)
            _int("encoder_cache_size", self.encoder_cache_size, 1, MAX_MODEL_LEN)
        _bool("disable_chunked_mm_input", self.disable_chunked_mm_input)
        _int("drafter_read_ahead", self.drafter_read_ahead, 0, max(self.num_speculative_tokens, 1))
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {RUNNERS}, got {self.runner!r}")
        if self.runner != "generate" and self.num_speculative_tokens > 0:
            raise ValueError(
                f"num_speculative_tokens ({self.num_speculative_tokens}) must be 0 for runner "
                f"'{self.runner}': it samples no tokens to verify drafts against"
            )
        if self.runner == "encoder_only" and self.encoder_compute_budget is None:
            raise ValueError(
                "runner 'encoder_only' runs a multimodal encoder: configure its encoder budget "
                "and cache size"
            )
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        check_scheduler(self)  # the rules between fields, as the core checks them


@dataclass(frozen=True)
class KVCacheGroup:
    """One KV-cache group of a hybrid model (vLLM's ``KVCacheGroupSpec``):
    layers that attend alike, with a block table of their own per request;
    every group shares the cache's blocks, and all but recurrent ones its
    block size unless ``block_size`` gives a full-attention or
    sliding-window group its own (vLLM's mixed-precision hybrids: layers
    stored at another precision fit another number of tokens in the pool's
    page; docs/scheduling.md §7.16).

    ``kind`` is "full" (every earlier token; ``size`` 0), "sliding_window"
    (``size``: the window, in tokens), "chunked_local" (``size``: the
    attention chunk, in tokens) or "cross_attention" (an encoder-decoder's
    decoder reading the encoder's output; ``size`` 0). ``admission_cap_blocks`` caps the blocks a
    window group counts in the whole-prompt admission check (vLLM's
    ``max_admission_blocks_per_request``: ``cdiv(min(window - 1 + in_flight,
    max_model_len), block_size) + 1`` for a sliding window, ``cdiv(min(chunk
    + in_flight, max_model_len), block_size)`` for chunked local attention,
    where ``in_flight`` is the tokens that can be in flight); None counts
    them all.

    ``kind`` "mamba" is a recurrent state (Mamba, linear attention):
    ``size`` is its tokens per state block (vLLM's ``mamba_block_size``:
    with prefix caching off, the model's length unless set; with it on,
    vLLM's mamba_cache_mode "align", the block size or a divisor of every
    attention group's, as beside attention blocks grown to hold its page:
    §7.16)
    and ``speculative_blocks`` the scratch states a drafter's tokens take
    (vLLM's ``MambaSpec.num_speculative_blocks``). With prefix caching on,
    ``prefill_checkpoint_alignment`` says the backend writes the prompt's
    checkpoint state from inside the chunk that passes it, at query offsets
    a multiple of it (vLLM's ``MambaSpec.prefill_checkpoint_alignment``
    where ``num_prefill_checkpoint_blocks`` is above 0: Mamba2 layers); None
    when it does not."""

    kind: str
    size: int = 0
    admission_cap_blocks: int | None = None
    speculative_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None
    block_size: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in GROUP_KINDS:
            raise ValueError(f"KVCacheGroup.kind must be one of {GROUP_KINDS}, got {self.kind!r}")
        if self.block_size is not None:
            _int("KVCacheGroup.block_size", self.block_size, 1, MAX_BLOCK_SIZE)
            if self.kind == "mamba":
                raise ValueError(
                    "KVCacheGroup.block_size: a Mamba group's block size is its size, got a "
                    "block_size beside it"
                )
        if isinstance(self.size, bool) or not isinstance(self.size, int):
            raise TypeError(f"KVCacheGroup.size must be an int, got {type(self.size).__name__}")
        if self.kind == "mamba":
            _int("KVCacheGroup.speculative_blocks", self.speculative_blocks, 0, MAX_NUM_BLOCKS)
            if self.prefill_checkpoint_alignment is not None:
                _int(
                    "KVCacheGroup.prefill_checkpoint_alignment",
                    self.prefill_checkpoint_alignment,
                    1,
                    MAX_MODEL_LEN,
                )
            if self.admission_cap_blocks is not None:
                raise ValueError(
                    "KVCacheGroup.admission_cap_blocks must be None for a mamba group, "
                    f"got {self.admission_cap_blocks}"
                )
        elif self.speculative_blocks != 0:
            raise ValueError(
                f"KVCacheGroup.speculative_blocks must be 0 for a {self.kind} group, "
                f"got {self.speculative_blocks}"
            )
        elif self.prefill_checkpoint_alignment is not None:
            raise ValueError(
                f"KVCacheGroup.prefill_checkpoint_alignment must be None for a {self.kind} "
                f"group, got {self.prefill_checkpoint_alignment}"
            )
        if self.kind in ("full", "cross_attention"):
            what = "full-attention" if self.kind == "full" else "cross-attention"
            if self.size != 0:
                raise ValueError(f"KVCacheGroup.size must be 0 for a {what} group, got {self.size}")
            if self.admission_cap_blocks is not None:
                raise ValueError(
                    f"KVCacheGroup.admission_cap_blocks must be None for a {what} group, "
                    f"got {self.admission_cap_blocks}"
                )
            return
        if not 1 <= self.size <= MAX_MODEL_LEN:
            raise ValueError(
                f"KVCacheGroup.size must be in [1, {MAX_MODEL_LEN}] for a {self.kind} group, "
                f"got {self.size}"
            )
        if self.admission_cap_blocks is not None:
            _int("KVCacheGroup.admission_cap_blocks", self.admission_cap_blocks, 1, MAX_NUM_BLOCKS)


@dataclass(frozen=True)
class CacheConfig:
    num_blocks: int | None = None  # including the reserved null block 0
    block_size: int = 16
    enable_prefix_caching: bool = True
    # The KV-cache groups of a hybrid model (full attention beside sliding
    # windows or chunked local attention), in vLLM's order (its layers' first
    # appearance); None is one full-attention group, () none: a model without
    # a KV cache (encoder-only attention, an encoder-only deployment), whose
    # pool is the null block alone (num_blocks 1) and which caches nothing.
    kv_cache_groups: tuple[KVCacheGroup, ...] | None = None
    # Sliding-window groups cache only the blocks a later request can resume
    # from (vLLM's default prefix_cache_retention_interval=0); False caches
    # every block (vLLM's None).
    sparse_retention: bool = True
    # Under sparse retention, window groups also cache the blocks that end
    # each segment of this many tokens (vLLM's prefix_cache_retention_interval
    # above 0: resumable checkpoints along long prompts); a multiple of
    # block_size, 0 for none (docs/scheduling.md §7.13).
    retention_interval: int = 0
    # The attention groups' KV is stored at more than one precision (vLLM's
    # has_mixed_precision_kv_cache: layers that skip KV-cache quantization):
    # a freed block may next be read at another precision, so new blocks are
    # listed for the runner to zero, as beside a recurrent group.
    mixed_precision: bool = False

    def __post_init__(self) -> None:
        _int("block_size", self.block_size, 1, MAX_BLOCK_SIZE)
        if self.num_blocks is not None:
            # Without a KV cache, vLLM's pool is the null block alone.
            none = isinstance(self.kv_cache_groups, (tuple, list)) and not self.kv_cache_groups
            least = 1 if none else 2
            _int("num_blocks", self.num_blocks, least, MAX_NUM_BLOCKS)
        _bool("enable_prefix_caching", self.enable_prefix_caching)
        if self.kv_cache_groups is not None:
            if not isinstance(self.kv_cache_groups, (tuple, list)):
                raise TypeError(
                    "kv_cache_groups must be a tuple of KVCacheGroup, got "
                    f"{type(self.kv_cache_groups).__name__}"
                )
            groups = tuple(self.kv_cache_groups)
            for i, g in enumerate(groups):
                if not isinstance(g, KVCacheGroup):
                    raise TypeError(
                        f"kv_cache_groups[{i}] must be a KVCacheGroup, got {type(g).__name__}"
                    )
            check_range("kv_cache_groups", len(groups), 0, MAX_KV_CACHE_GROUPS)
            if not groups and self.enable_prefix_caching:
                raise ValueError(
                    "kv_cache_groups is empty (a model without a KV cache): "
                    "enable_prefix_caching must be false"
                )
            object.__setattr__(self, "kv_cache_groups", groups)  # frozen: a list becomes a tuple
        _bool("sparse_retention", self.sparse_retention)
        _int("retention_interval", self.retention_interval, 0, MAX_MODEL_LEN)
        _bool("mixed_precision", self.mixed_precision)

    @property
    def num_kv_cache_groups(self) -> int:
        """KV-cache groups: each request holds a block table per group."""
        return 1 if self.kv_cache_groups is None else len(self.kv_cache_groups)


def blocks_for_one_sequence(
    cache_config: CacheConfig, max_model_len: int, max_encoder_tokens: int
) -> int:
    """Blocks one max_model_len sequence holds: a table's worth in every
    decoder group, a window group's capped at its admission cap when it has
    one, ``max_encoder_tokens``' worth in a cross-attention group, and its
    states in a recurrent group (one of vLLM's default size, plus the
    scratch states; with prefix caching, vLLM's cache mode "align", the two
    it holds at most between steps plus the scratch states: as vLLM sizes a
    hybrid or encoder-decoder cache at start-up)."""
    bs = cache_config.block_size
    align = cache_config.enable_prefix_caching
    groups = cache_config.kv_cache_groups
    if groups is None:
        groups = (KVCacheGroup("full"),)

    def states(g: KVCacheGroup) -> int:
        # "align": the state a step starts from, the one it ends in, and a
        # prefill checkpoint's where the backend writes one.
        held = 2 + int(g.prefill_checkpoint_alignment is not None)
        return (held if align else cdiv(max_model_len, g.size)) + g.speculative_blocks

    def per_group(g: KVCacheGroup, tokens: int = max_model_len) -> int:
        return cdiv(tokens, bs if g.block_size is None else g.block_size)

    return sum(
        per_group(g, max_encoder_tokens)
        if g.kind == "cross_attention"
        else states(g)
        if g.kind == "mamba"
        else per_group(g)
        if g.admission_cap_blocks is None
        else min(per_group(g), g.admission_cap_blocks)
        for g in groups
    )


def check_fits(scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
    """vLLM's start-up refusal: the cache must hold one max_model_len sequence
    (in every KV-cache group; a cross-attention group, one step's encoder
    tokens)."""
    if cache_config.num_blocks is None:
        raise ValueError("num_blocks must be set to build a scheduler, got None")
    needed = blocks_for_one_sequence(
        cache_config,
        scheduler_config.max_model_len,
        scheduler_config.encoder_compute_budget or 0,
    )
    if needed > cache_config.num_blocks - 1:
        raise ValueError(
            f"num_blocks ({cache_config.num_blocks}) holds {cache_config.num_blocks - 1} usable "
            f"blocks, fewer than the {needed} one sequence of max_model_len "
            f"({scheduler_config.max_model_len}) needs"
        )
