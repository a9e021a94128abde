"""The vLLM differential must catch a drop-in that goes wrong where vLLM's
state lives outside the core: each test breaks the drop-in one way (a grammar
that is not advanced, a KV-cache event dropped, events reordered, the
auxiliary-output connector asked late, finished
ids added in another order, a draft
lost, acceptance miscounted, a drafter's settings not passed on, drafting
never skipped, window or recurrent KV-cache groups passed on wrong, the
blocks to zero left out, an encoder budget
or cache short by one, images' data updates lost, prompt embeddings left
out of the hash, a pooled result left off its output) and checks
that the random workloads of test_vllm_differential fail within a few seeds."""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.v1.outputs import DraftTokenIds  # noqa: E402

import ironbatch.vllm.settings as settings  # noqa: E402
from ironbatch.config import KVCacheGroup, SchedulerConfig  # noqa: E402
from ironbatch.core_scheduler import CoreScheduler  # noqa: E402
from ironbatch.vllm.encoder_inputs import EncoderInputs  # noqa: E402
from ironbatch.vllm.kv_events import KvEvents  # noqa: E402
from ironbatch.vllm.scheduler import Scheduler  # noqa: E402
from ironbatch.vllm.speculation import Speculation  # noqa: E402
from ironbatch.vllm.structured_outputs import StructuredOutputs  # noqa: E402

from test_vllm_differential import drawn_features, run_workload  # noqa: E402

SEEDS = 40
# Workloads until one with a drafter of its own (EAGLE, MTP, a draft model)
# has shown a broken drafter setting.
SPEC_SEEDS = 120


def caught(seeds: int = SEEDS, feature: str | None = None) -> bool:
    """Whether some workload's comparison with vLLM fails, or the broken
    drop-in trips over its own inconsistent state (a ValueError: e.g. block
    hashes that no longer match the blocks its KV-cache events name); with
    ``feature``, over the first ``seeds`` workloads that draw it."""
    drawing = (s for s in range(10**6) if feature is None or drawn_features(s)[feature])
    for _, seed in zip(range(seeds), drawing, strict=False):
        try:
            run_workload(seed, steps=40)
        except AssertionError:
            return True
        except ValueError as e:
            # The drop-in's own (not a config vLLM refuses, which would make
            # every mutation look caught).
            if "/ironbatch/" not in traceback.extract_tb(e.__traceback__)[-1].filename:
                raise
            return True
    return False


def test_the_unbroken_drop_in_passes() -> None:
    assert not caught(8)


def test_a_grammar_not_advanced_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def accept_without_the_grammar(self: Any, rid: str, kept: list[int], num_tokens: int) -> bool:
        r = self.requests[rid]
        r._all_token_ids.extend(kept)
        r._output_token_ids.extend(kept)
        return True

    monkeypatch.setattr(StructuredOutputs, "accept", accept_without_the_grammar)
    assert caught()


def test_a_dropped_kv_event_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    convert: Callable[..., None] = KvEvents.convert

    def convert_but_drop_removals(
        self: KvEvents, events: list[Any], request_of: Any, *rest: Any
    ) -> None:
        convert(self, [e for e in events if e.kind != "removed"], request_of, *rest)

    monkeypatch.setattr(KvEvents, "convert", convert_but_drop_removals)
    assert caught()


def test_reordered_kv_events_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    publish: Callable[..., None] = KvEvents.publish

    def publish_reversed(self: KvEvents) -> None:
        self.pending.reverse()
        publish(self)

    monkeypatch.setattr(KvEvents, "publish", publish_reversed)
    assert caught()


def test_request_events_heard_after_the_cache_events_are_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Routed experts: vLLM's auxiliary-output connector asked at each
    lookup and release what the cache holds at the call's end, not at that
    moment; the blocks it retains, touches and releases then differ."""
    convert: Callable[..., None] = KvEvents.convert

    def requests_last(self: KvEvents, events: list[Any], request_of: Any, *rest: Any) -> None:
        marks = ("lookup", "released")
        late = [e for e in events if e.kind not in marks] + [e for e in events if e.kind in marks]
        convert(self, late, request_of, *rest)

    monkeypatch.setattr(KvEvents, "convert", requests_last)
    assert caught(seeds=SEEDS, feature="feature: routed experts")


def test_finished_and_preempted_ids_added_in_another_order_are_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM adds a step's finished and preempted ids to its sets as they
    come; a connector iterating such a set follows the order that built it
    where ids' hashes collide (CPU offloading's store jobs do)."""
    schedule = Scheduler.schedule

    def schedule_sorted(self: Scheduler, *args: Any, **kwargs: Any) -> Any:
        output = schedule(self, *args, **kwargs)
        output.finished_req_ids = set(sorted(output.finished_req_ids))
        if output.preempted_req_ids is not None:
            output.preempted_req_ids = set(sorted(output.preempted_req_ids))
        return output

    monkeypatch.setattr(Scheduler, "schedule", schedule_sorted)
    assert caught()


def test_a_draft_lost_on_the_way_in_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    take: Callable[..., None] = Speculation.take_drafts

    def take_but_drop_the_last(self: Speculation, drafts: DraftTokenIds) -> None:
        shorter = [d[:-1] for d in drafts.draft_token_ids]
        take(self, DraftTokenIds(req_ids=drafts.req_ids, draft_token_ids=shorter))

    monkeypatch.setattr(Speculation, "take_drafts", take_but_drop_the_last)
    assert caught()


def test_acceptance_stats_off_by_one_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    stats: Callable[..., Any] = Speculation.stats

    def one_more_accepted(*args: Any) -> Any:
        s = stats(*args)
        s.num_accepted_tokens += 1
        return s

    monkeypatch.setattr(Speculation, "stats", staticmethod(one_more_accepted))
    assert caught()


@pytest.mark.parametrize(
    "setting", ["num_lookahead_tokens", "num_hash_lookahead_tokens", "num_draft_slots"]
)
def test_a_drafter_setting_not_passed_on_is_caught(
    monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    """The core built as if the drafter (EAGLE, MTP, a draft model) did not
    reserve lookahead slots, hash ahead or take drafting slots."""
    build = settings.CoreScheduler

    def without(scheduler_config: SchedulerConfig, cache_config: Any) -> Any:
        return build(dataclasses.replace(scheduler_config, **{setting: 0}), cache_config)

    monkeypatch.setattr(settings, "CoreScheduler", without)
    if setting == "num_hash_lookahead_tokens":
        # Seen only where hashes are kept: the first workloads that hash ahead.
        assert caught(seeds=12, feature="feature: lookahead block hashes")
    else:
        assert caught(seeds=SPEC_SEEDS)


def test_drafts_never_skipped_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``skip_drafts`` left off where vLLM's V2 runner may skip drafting."""
    # Set in __init__; a property that ignores the write keeps it off.
    never = property(lambda self: False, lambda self, value: None)
    monkeypatch.setattr(Scheduler, "can_skip_drafts", never, raising=False)
    assert caught(seeds=SPEC_SEEDS)


def patch_groups(
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[tuple[KVCacheGroup, ...]], tuple[KVCacheGroup, ...]],
) -> None:
    """Hand the core ``change`` of the KV-cache groups the drop-in reads off
    vLLM's config (one full-attention group, None, stays as it is)."""
    groups_of = settings.kv_cache_groups

    def wrong(vllm_config: Any, kv_cache_config: Any, cache_block_size: int) -> Any:
        groups = groups_of(vllm_config, kv_cache_config, cache_block_size)
        return None if groups is None else change(groups)

    monkeypatch.setattr(settings, "kv_cache_groups", wrong)


def replace_kinds(kinds: tuple[str, ...], **changes: Any) -> Any:
    """A group change: ``changes`` (or a callable of the group, by field)
    applied to the groups of ``kinds``."""

    def change(groups: tuple[KVCacheGroup, ...]) -> tuple[KVCacheGroup, ...]:
        return tuple(
            dataclasses.replace(g, **{k: v(g) if callable(v) else v for k, v in changes.items()})
            if g.kind in kinds
            else g
            for g in groups
        )

    return change


@pytest.mark.parametrize("mutation", ["all full attention", "window 16 tokens wider"])
def test_window_groups_passed_on_wrong_are_caught(
    monkeypatch: pytest.MonkeyPatch, mutation: str
) -> None:
    """The core told the model's window groups wrong: as full attention
    (blocks never given back, every hit a full-attention hit), or with a
    window off by a block's worth."""
    if mutation == "all full attention":
        patch_groups(monkeypatch, lambda groups: tuple(KVCacheGroup(kind="full") for _ in groups))
    else:
        windows = ("sliding_window", "chunked_local")
        patch_groups(monkeypatch, replace_kinds(windows, size=lambda g: g.size + 16))
    assert caught()


@pytest.mark.parametrize("mutation", ["the cache's block size", "not mixed precision"])
def test_groups_of_different_block_sizes_passed_on_wrong_are_caught(
    monkeypatch: pytest.MonkeyPatch, mutation: str
) -> None:
    """A mixed-precision hybrid's groups (docs/scheduling.md §7.16) told the
    core wrong: every group of the cache's block size, or its new blocks not
    listed for zeroing."""
    if mutation == "the cache's block size":
        patch_groups(monkeypatch, replace_kinds(("full", "sliding_window"), block_size=None))
    else:
        build = settings.CoreScheduler

        def uniform(scheduler_config: SchedulerConfig, cache_config: Any) -> Any:
            return build(scheduler_config, dataclasses.replace(cache_config, mixed_precision=False))

        monkeypatch.setattr(settings, "CoreScheduler", uniform)
    assert caught(8, feature="feature: groups of different block sizes")


def test_states_smaller_than_attention_blocks_passed_on_wrong_are_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recurrent states beside larger attention blocks (Qwen3-Next with MTP,
    docs/scheduling.md §7.16) told the core wrong: the attention blocks
    said to be the states' size."""

    def states_size(groups: tuple[KVCacheGroup, ...]) -> tuple[KVCacheGroup, ...]:
        size = next(g.size for g in groups if g.kind == "mamba")
        return replace_kinds(("full", "sliding_window"), block_size=size)(groups)

    patch_groups(monkeypatch, states_size)
    assert caught(8, feature="feature: recurrent states smaller than attention blocks")


@pytest.mark.parametrize(
    "mutation", ["no scratch states", "half the state block", "nothing to zero"]
)
def test_recurrent_groups_passed_on_wrong_are_caught(
    monkeypatch: pytest.MonkeyPatch, mutation: str
) -> None:
    """Mamba and linear-attention groups (prefix caching off) told the core
    wrong: without their drafts' scratch states, with state blocks half
    their size (freed as tokens pass), or the attention blocks vLLM's
    runner must zero left out of the step."""
    seeds = SEEDS
    if mutation == "nothing to zero":
        schedule = Scheduler.schedule

        def schedule_without_zeroing(self: Scheduler, *args: Any, **kwargs: Any) -> Any:
            output = schedule(self, *args, **kwargs)
            output.new_block_ids_to_zero = None
            return output

        monkeypatch.setattr(Scheduler, "schedule", schedule_without_zeroing)
    elif mutation == "no scratch states":
        patch_groups(monkeypatch, replace_kinds(("mamba",), speculative_blocks=0))
        seeds = SPEC_SEEDS  # drafting beside recurrent groups is rarer
    else:
        patch_groups(monkeypatch, replace_kinds(("mamba",), size=lambda g: max(g.size // 2, 1)))
    assert caught(seeds)


@pytest.mark.parametrize("mutation", ["compute budget", "cache size"])
def test_an_encoder_budget_short_by_one_is_caught(
    monkeypatch: pytest.MonkeyPatch, mutation: str
) -> None:
    """The core told the vision model's encoder budget or cache one
    embedding short: an image as large as the budget never runs, or the
    cache evicts (or refuses) a step early."""
    budget_of = settings.encoder_budget

    def short(vllm_config: Any, mm_registry: Any) -> tuple[int | None, int | None]:
        compute, cache = budget_of(vllm_config, mm_registry)
        if compute is None or cache is None:
            return compute, cache
        if mutation == "compute budget":
            return max(1, compute - 1), cache
        return compute, max(1, cache - 1)

    monkeypatch.setattr(settings, "encoder_budget", short)
    assert caught()


def test_image_data_not_sent_again_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Model runner V2's ``encoder_input_updates`` left empty: the worker
    never learns which images it may drop."""
    monkeypatch.setattr(EncoderInputs, "updates", lambda self, *args: {})
    assert caught()


def test_prompt_embeddings_left_out_of_the_hash_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt given as embeddings hashed by its token ids alone (vLLM's
    zeros where an embedding stands): prompts that differ only in their
    embeddings share blocks."""
    monkeypatch.setattr(CoreScheduler, "digests_of", lambda self, embeds: None)
    assert caught()


def test_a_pooled_result_left_off_its_output_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """An embedding model's requests finish with their pooled tensor on the
    output; a drop-in that finished them without it loses the embedding."""
    import ironbatch.vllm.scheduler as dropin

    monkeypatch.setattr(dropin, "attach_pooler_outputs", lambda update, mro: None)
    assert caught()
