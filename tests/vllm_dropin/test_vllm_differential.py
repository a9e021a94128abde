"""Differential: vLLM 0.33's own scheduler and ``ironbatch.vllm.Scheduler``
over random workloads (sync and async scheduling, FCFS and priority, tight
and ample KV caches, prefix caching on and off, chunked prefill on and off,
shared prefixes and cache salts, EOS and stop tokens, aborts, prefix-cache
resets, pauses, model runner V1 and V2 output shapes, structured outputs
with grammars that compile late, fail or reject tokens, and a reasoning
parser) must produce equal SchedulerOutputs, grammar masks and
EngineCoreOutputs at every step. Runs where vLLM is
importable (``scripts/test_vllm.sh``)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from vllm.config import KVEventsConfig, LoRAConfig, ObservabilityConfig  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import (  # noqa: E402
    MultiModalFeatureSpec,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from vllm.pooling_params import PoolingParams  # noqa: E402
from vllm.sampling_params import RepetitionDetectionParams  # noqa: E402
from vllm.v1.core.sched.interface import PauseState  # noqa: E402

from ironbatch.bench.standin_ec_connector import EcShares  # noqa: E402
from ironbatch.bench.vllm_standin_ec_connector import ec_transfer_config  # noqa: E402
from ironbatch.vllm import harness  # noqa: E402

import vllm_setup  # noqa: E402
from fake_grammar import REJECTED, THINK_END  # noqa: E402
from seeded import REACH, Workloads  # noqa: E402
from vllm_pair import VllmPair  # noqa: E402

VOCAB = 60
EOS = vllm_setup.EOS
STOP = 7
REPEATS = RepetitionDetectionParams(max_pattern_size=2, min_count=3)
# Workloads per run and at full size (IRONBATCH_FULL=1), in CHUNKS tests of
# their own: each chunk draws its seeds from the run's seed.
WORKLOADS, FULL_WORKLOADS = 364, 1040
CHUNKS = 13


def random_settings(rng: random.Random) -> dict:
    bs = rng.choice([4, 8, 16])
    max_model_len = rng.choice([64, 128, 256])
    chunked = rng.random() < 0.8
    seqs = rng.choice([2, 4, 8, 16])
    batched = max(rng.choice([16, 32, 64, 256]), seqs)
    if not chunked:
        batched = max(batched, max_model_len)
    need = -(-max_model_len // bs)
    tight = rng.random() < 0.5
    blocks = rng.randint(need // 2 + 2, need + 2) if tight else rng.randint(3 * need, 6 * need)
    pp = rng.choice([1] * 4 + [2, 3])
    # Window KV-cache groups (gpt-oss, Gemma 3, Llama 4) in about a third of
    # the workloads.
    hybrid = rng.random() < 0.35
    settings = dict(
        block_size=bs,
        num_blocks=blocks,
        max_model_len=max_model_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=rng.choice([0, 0, 0, 8, 32]),
        policy=rng.choice(["fcfs", "priority"]),
        enable_prefix_caching=rng.random() < 0.8,
        async_scheduling=rng.random() < 0.5,
        log_stats=rng.random() < 0.8,
        # vLLM's rarer options, each off most of the time.
        max_num_scheduled_tokens=rng.choice(
            [None] * 4 + ([max(seqs, batched // 2)] if chunked else []) + [batched * 2]
        ),
        max_num_active_seqs=rng.choice([None] * 4 + [max(1, seqs // 2)]),
        long_prefill_token_threshold_adaptive=rng.random() < 0.15,
        watermark=rng.choice([0.0] * 5 + [0.05, 0.2]),
        mla=rng.random() < 0.3,
        prefill_schedule_interval=rng.choice([1] * 3 + [2, 4]),
        pipeline_parallel_size=pp,
        data_parallel_size=rng.choice([1, 1, 2]),
    )
    settings.update(kv_events(rng))
    settings.update(kv_metrics(rng))
    settings.update(speculation(rng, pp, bs, hybrid))
    if method_of(settings) in RUNNER_V1_METHODS:
        settings["async_scheduling"] = False
    spec_metrics(rng, settings)
    dropping = settings.get("speculative_config", {}).get("disable_lookahead_block_hashes", False)
    settings.update(kv_layout(rng, bs, hybrid, dropping))
    settings.update(lora(rng))  # late: the draws before it stay each seed's
    settings.update(multimodal(rng, settings))
    settings.update(ec_connector(rng, settings))
    settings.update(prompt_embeddings(rng))
    settings.update(sampling_masks(rng, settings))
    settings.update(pooling(rng, settings))
    settings.update(no_kv_cache(rng, settings))
    settings.update(context_parallel(rng, settings))
    settings.update(recurrent_layout(rng, settings))
    settings.update(mixed_block_sizes(rng, settings))
    settings.update(routed_experts(rng, settings))
    # Every group holds blocks of its own: the same tightness per attention
    # group, and room for two requests' states in each recurrent group.
    settings["num_blocks"] = (blocks - 1) * GROUPS[settings["kv_layout"]] + 1
    settings["num_blocks"] += 2 * recurrent_blocks(settings)
    if settings.get("target") == "whisper":
        encoder_decoder(settings, blocks)
        settings.update(whisper_block_sizes(rng, settings))
    return settings


def mixed_block_sizes(rng: random.Random, settings: dict) -> dict:
    """Window and full-attention groups of different block sizes
    (docs/scheduling.md §7.16), with KV-cache events and EAGLE's last-block
    drop and multi-module MTP where drawn: in
    half the gpt-oss, Gemma 3 and Llama 4 layouts (a mixed-precision
    hybrid) the windows' or the full group's blocks two or four times the
    cache's (drawn apart; Llama 4's chunks whole blocks of their own, and
    with prefix caching on its chunked groups' blocks the larger, as vLLM
    asserts); in half the recurrent layouts, attention blocks that large
    beside states of the cache's block size with prefix caching on (vLLM's
    "align": Qwen3-Next with MTP, whose attention blocks grow to hold its
    states' page) or of their own with it off (a mixed-precision hybrid
    whose states are uncached); a retention interval on the larger block."""
    drawn = random.Random(rng.random())
    layout = settings["kv_layout"]
    recurrent = layout in RECURRENT_GROUPS
    if not (layout in ("gpt-oss", "gemma3", "llama4") or recurrent) or drawn.random() < 0.5:
        return {}
    if layout == "mamba":
        return {}  # (states alone: no attention block)
    bs = settings["block_size"]
    larger = bs * drawn.choice([2, 4])
    which = drawn.choice(["window_block_size", "full_block_size"])
    if recurrent and layout != "swa-mamba":
        which = "full_block_size"
    if layout == "llama4" and settings["enable_prefix_caching"]:
        which = "window_block_size"
    out: dict = {which: larger}
    if layout == "llama4" and which == "window_block_size":
        out["window"] = -(-settings["window"] // larger) * larger
    if settings.get("retention_interval"):
        out["retention_interval"] = larger * drawn.choice([1, 2])
    return out


def encoder_decoder(settings: dict, blocks: int) -> None:
    """A Whisper-shaped workload's settings, as vLLM's engine makes them
    for an encoder-decoder model: no chunked prefill (its budget then holds
    a whole prompt), no prefix caching, no pipeline parallelism (Whisper has
    none); and without prompt embeddings. Its blocks: the decoder's as
    drawn, and a step's encoder tokens for cross-attention (vLLM's start-up
    sizing)."""
    settings.pop("enable_prompt_embeds", None)
    settings.update(
        enable_chunked_prefill=False,
        max_num_batched_tokens=max(settings["max_num_batched_tokens"], settings["max_model_len"]),
        max_num_scheduled_tokens=None,
        enable_prefix_caching=False,
        pipeline_parallel_size=1,
    )
    compute = settings["mm_budget"][0]
    settings["num_blocks"] = blocks + -(-compute // settings["block_size"])


def whisper_block_sizes(rng: random.Random, settings: dict) -> dict:
    """In half the Whisper workloads, the decoder's or the cross-attention
    group's blocks two or four times the cache's (drawn apart): Whisper
    with an fp8 KV cache that some layers skip."""
    drawn = random.Random(rng.random())
    if drawn.random() < 0.5:
        return {}
    which = drawn.choice(["full_block_size", "cross_block_size"])
    return {which: settings["block_size"] * drawn.choice([2, 4])}


# Attention KV-cache groups per layout ("none": the null block alone, vLLM's
# one block).
GROUPS = {"full": 1, "gpt-oss": 2, "gemma3": 6, "llama4": 4, "none": 0}
GROUPS.update({"qwen3-next": 1, "jamba": 1, "swa-mamba": 2, "mamba": 0})
# Recurrent-state groups per layout.
RECURRENT_GROUPS = {"qwen3-next": 3, "jamba": 1, "swa-mamba": 1, "mamba": 1}


def recurrent_layout(rng: random.Random, settings: dict) -> dict:
    """Recurrent-state groups (Mamba, linear attention) in some workloads
    with one full-attention group (drawn apart): Qwen3-Next's three
    linear-attention groups beside full attention, Jamba's Mamba group
    beside it, a sliding window beside both, or Mamba alone; half with
    prefix caching off (vLLM's mamba_cache_mode "none"), the state block the
    model's length mostly (vLLM's default), else two blocks; half with it on
    ("align", states of the block size; a quarter of those cache every
    state, vLLM's retention interval None). Not with Whisper or decode
    context parallelism (vLLM runs neither beside recurrent layers);
    multi-module MTP with prefix caching on too (not beside states alone,
    which the drop-in hands to vLLM's scheduler), EAGLE's last-block drop
    with it on."""
    drawn = random.Random(rng.random())
    # (More often beside multi-module MTP: the rarer drafter.)
    multi_module = settings.get("num_mtp_layers", 1) > 1
    if drawn.random() >= (0.6 if multi_module else 0.32) or settings["kv_layout"] != "full":
        return {}
    if settings.get("target") == "whisper" or "decode_context_parallel_size" in settings:
        return {}
    # Beside EAGLE's last-block drop, states cached (the drop needs prefix
    # caching).
    dropping = bool(settings.get("speculative_config", {}).get("disable_lookahead_block_hashes"))
    layout = drawn.choice(["qwen3-next", "qwen3-next", "jamba", "swa-mamba", "mamba"])
    bs = settings["block_size"]
    out = {
        "kv_layout": layout,
        "enable_prefix_caching": False,
        "mamba_block_size": drawn.choice([None, None, None, 2 * bs]),
    }
    if layout == "swa-mamba":
        out["window"] = drawn.choice([bs // 2 + 1, bs + 3, 2 * bs])
    # Multi-module MTP beside cached states, but not beside states alone
    # (the drop-in hands it to vLLM's scheduler).
    cacheable = not multi_module or layout != "mamba"
    if (drawn.random() < (0.8 if multi_module else 0.5) or dropping) and cacheable:
        # Prefix caching on (vLLM's default, mamba_cache_mode "align"):
        # states of the block size, chunked prefill (vLLM requires it), a
        # budget of more than a block besides a drafter's slots (else no
        # chunk ends on a block, in vLLM too), images that may be split
        # (else one across a block's end never runs, in vLLM too).
        out.update(
            enable_prefix_caching=True,
            enable_chunked_prefill=True,
            mamba_block_size=None,
            max_num_batched_tokens=max(settings["max_num_batched_tokens"], bs + 16),
        )
        if settings.get("disable_chunked_mm_input"):
            out["disable_chunked_mm_input"] = False
        # Mamba2's backend writes the prompt's checkpoint inside a chunk.
        out["mamba_checkpoint_alignment"] = random.Random(drawn.random()).choice([None, 1, 4])
        # Qwen3-Next's three groups of two state shapes in half (drawn
        # apart): unlike specs, which vLLM looks up apart.
        if layout == "qwen3-next" and random.Random(drawn.random()).random() < 0.5:
            out["mamba_specs_alike"] = False
        # vLLM's default retention interval, 0, caches only the states a
        # later request resumes from; None caches them all (drawn apart).
        # Not beside Mamba2's checkpoints with drafts: every step may then
        # write one, and a decode step verifying a block of drafts asks
        # vLLM for a hash it does not have yet (it asserts).
        retention = random.Random(drawn.random()).choice([0, 0, 0, None])
        drafting = "speculative_config" in settings
        if out["mamba_checkpoint_alignment"] is None or not drafting:
            out["retention_interval"] = retention
    return out


def livelock_state(pair: VllmPair) -> tuple:
    """What must change for a drained workload to be making progress: each
    request's status and counts, the steps in flight and the free blocks."""
    requests = tuple(
        (rid, r.status, r.num_computed_tokens, r.num_tokens)
        for rid, r in sorted(pair.vllm.requests.items())
    )
    free = pair.vllm.kv_cache_manager.block_pool.get_num_free_blocks()
    return requests, len(pair.in_flight), free


def recurrent_blocks(settings: dict) -> int:
    """Blocks one request's states take in a layout's recurrent groups: a
    block per state block of its length (at most three live states with
    prefix caching), and a scratch state per draft."""
    groups = RECURRENT_GROUPS.get(settings["kv_layout"], 0)
    if not groups:
        return 0
    max_len = settings["max_model_len"]
    per_state = settings.get("mamba_block_size") or max_len
    k = settings.get("speculative_config", {}).get("num_speculative_tokens", 0)
    if settings["enable_prefix_caching"]:
        # "align": the state a step starts from, the one it ends in, one
        # more with a step in flight, and a prefill checkpoint's.
        return groups * (4 + k)
    return groups * (-(-max_len // per_state) + k)


def no_kv_cache(rng: random.Random, settings: dict) -> dict:
    """No KV cache (docs/scheduling.md §7.14) in some: an embedding model
    with encoder-only attention (BERT and kin: a pooling runner, mostly
    without chunked prefill), or the vision model's encoder alone
    (``--mm-encoder-only``, §4.18: nothing sampled, a request done once its
    prompt is consumed, chunked regardless; no drafter, one engine). vLLM
    gives such a model one block and turns prefix caching off; KV-cache
    events and metrics then have nothing to report."""
    if settings["kv_layout"] != "full":
        return {}  # window layouts keep their share
    bert = settings.get("runner") == "pooling" and rng.random() < 0.4
    encoder_alone = (
        settings.get("target") in (None, "vision")
        and settings.get("runner") != "pooling"
        and "speculative_config" not in settings
        and rng.random() < 0.3
    )
    if not (bert or encoder_alone):
        return {}
    out: dict = {"kv_layout": "none", "enable_prefix_caching": False}
    if encoder_alone and "target" not in settings:  # the vision model, then
        compute = rng.choice([8, 24, 48, 96])
        budget = (compute, rng.choice([compute, 2 * compute]))
        out.update(target="vision", mm_budget=budget, disable_chunked_mm_input=False)
    if rng.random() < 0.6:
        batched = max(settings["max_num_batched_tokens"], settings["max_model_len"])
        out.update(
            enable_chunked_prefill=False,
            max_num_batched_tokens=batched,
            max_num_scheduled_tokens=None,
            long_prefill_token_threshold=0,
        )
    if encoder_alone:
        out.update(mm_encoder_only=True, pipeline_parallel_size=1, data_parallel_size=1)
        if not out.get("enable_chunked_prefill", True):
            # About a prompt a step: a second prompt overruns it, and vLLM
            # chunks it anyway.
            out["max_num_batched_tokens"] = settings["max_model_len"]
    return out


def context_parallel(rng: random.Random, settings: dict) -> dict:
    """Decode context parallelism over two ranks in some workloads with one
    full-attention decoder group (drawn apart; vLLM has no window groups
    with it): vLLM then schedules blocks twice the configured size."""
    drawn = random.Random(rng.random()).random() < 0.35
    if not drawn or settings["kv_layout"] != "full" or settings.get("target") == "whisper":
        return {}
    if "kv_events_config" in settings:
        # vLLM 0.33's hit events (kv_cache_report_mode "full") assert on
        # decode context parallelism's blocks: its own engine cannot run it.
        return {}
    return {"decode_context_parallel_size": 2}


def kv_layout(rng: random.Random, bs: int, hybrid: bool, dropping: bool = False) -> dict:
    """The KV-cache groups: one full-attention group mostly, else gpt-oss's
    (a sliding window, then full), Gemma 3's (five windows, then full) or
    Llama 4's (three chunked-local groups, then full), with windows and
    chunks from under a block to several, and vLLM's sparse or dense window
    caching."""
    if not hybrid:
        return {"kv_layout": "full"}
    layout = rng.choice(["gpt-oss", "gpt-oss", "gemma3", "llama4"])
    if layout == "llama4" and dropping:
        # vLLM turns its hybrid manager off for EAGLE's drop beside chunked
        # local attention: such a model has one group.
        layout = "gpt-oss"
    return vllm_setup.draw_layout(rng, layout, bs)


# Speculative methods, each as often as drawn here: n-gram (no drafter of its
# own), EAGLE and EAGLE-3 (lookahead KV slots, block hashes over the next
# token), MTP (the same, on a DeepSeek-shaped target with MLA) and a draft
# model (lookahead slots, and a drafting slot per request in the budget);
# n-gram on the GPU hands over k drafts, -1 in the slots it could not fill;
# hidden-state extraction (a "drafter" that caches the target's hidden states
# for a KV connector and proposes the sampled tokens: drafts of the usual
# shape, no lookahead); DFlash (a block drafter over the target's hidden
# states: k + 1 lookahead slots, no hash lookahead, no block drop); DSpark
# (the same on model runner V2, with k slots when it samples from the
# anchor); suffix decoding and a proposer class of the user's (no drafter
# forward pass: drafts of any length up to k, on model runner V1 and
# without async scheduling, as vLLM runs them).
SPEC_METHODS = ("ngram", "ngram_gpu", "eagle", "eagle3", "mtp", "draft_model")
SPEC_METHODS += ("extract_hidden_states", "dflash", "dspark", "suffix", "custom_class")
# The methods vLLM runs on its V1 model runner only, where it refuses them
# with async scheduling.
RUNNER_V1_METHODS = ("suffix", "custom_class")


def method_of(settings: dict) -> str | None:
    """The workload's speculative method, if it speculates."""
    return settings.get("speculative_config", {}).get("method")


def speculation(rng: random.Random, pp: int, bs: int, hybrid: bool) -> dict:
    """Speculative decoding in some workloads, with pipeline parallelism in
    some (not hidden-state extraction, whose model vLLM cannot split into
    stages). Less often beside pipeline parallelism, so that what comes
    without speculation (pooling, Whisper) keeps its share."""
    # Less often beside window groups too, for the same reason.
    if rng.random() < (0.3 if pp > 1 else 0.4 if hybrid else 0.75):
        k = rng.choice([1, 2, 3, 5])
        method = rng.choice(SPEC_METHODS)
        if pp > 1 and method == "extract_hidden_states":
            method = "ngram"
        spec: dict = {"method": method, "num_speculative_tokens": k}
        if method in ("ngram", "ngram_gpu"):
            spec.update(prompt_lookup_max=3, prompt_lookup_min=1)
        if method == "dspark":
            # Fill-in drafting after a bonus query in some (drawn apart).
            anchor = random.Random(rng.random()).random() < 0.5
            spec["model"] = harness.tiny_dspark_dir(sample_from_anchor=anchor)
        # Dynamic speculation lengths in some (drawn apart): k drafts for
        # small batches, fewer for larger ones.
        dynamic = random.Random(rng.random())
        if dynamic.random() < 0.25:
            small = dynamic.randint(1, 3)
            spec["num_speculative_tokens_per_batch_size"] = [
                (1, small, k),
                (small + 1, 64, dynamic.randint(1, k)),
            ]
        # EAGLE's last-block drop in some EAGLE-style workloads (drawn
        # apart): lookahead block hashes off, so a prefix hit gives up its
        # last block instead; beside window groups, with the drafter's
        # layers in the full-attention group (as vLLM's planner finds them)
        # or in none (vLLM then drops a block in every group).
        drawn = random.Random(rng.random())
        drop = drawn.random() < (0.7 if hybrid else 0.4)
        settings: dict = {"speculative_config": spec}
        if method in ("eagle", "eagle3", "mtp") and drop:
            spec["disable_lookahead_block_hashes"] = True
            settings["drafter_in_full_group"] = drawn.random() < 0.5
        if method == "mtp":
            settings.update(target="deepseek_mtp", mla=True)
            # DeepSeek-V3's three MTP modules in some (drawn apart): the
            # drafter reads k prompt tokens ahead (vLLM refuses a block
            # smaller than that with prefix caching).
            multi = random.Random(rng.random()).random() < 0.8
            if k in (2, 3) and k <= bs and multi:
                settings["num_mtp_layers"] = 3
        return settings
    return {}


def lora(rng: random.Random) -> dict:
    """LoRA adapters on in some workloads, at most 1 to 4 in a step's batch
    (vLLM's max_loras); the workload draws up to 8 adapters."""
    if rng.random() < 0.3:
        return {"lora_config": LoRAConfig(max_loras=rng.randint(1, 4), max_lora_rank=8)}
    return {}


def multimodal(rng: random.Random, settings: dict) -> dict:
    """A vision model (Qwen2.5-VL's shape) in some workloads, with an
    encoder budget and cache from about one image to several, and
    --disable-chunked-mm-input in some (not with a long-prefill cap, under
    which vLLM itself never schedules an image longer than the cap)."""
    if rng.random() >= 0.3 or settings.get("target") == "deepseek_mtp":
        return {}
    compute = rng.choice([8, 24, 48, 96])
    cache = rng.choice([compute, 2 * compute, 4 * compute])
    whole = settings["long_prefill_token_threshold"] == 0 and rng.random() < 0.3
    # Whisper (audio for an encoder, cross-attention) in some: one KV-cache
    # group of the decoder's, with speculation in some (n-gram lookup, or a
    # drafter whose lookahead slots the decoder's group holds: less often,
    # so that images keep their share).
    method = settings.get("speculative_config", {}).get("method", "ngram")
    if settings["kv_layout"] == "full":
        if rng.random() < (0.6 if method in ("ngram", "ngram_gpu") else 0.3):
            return {"target": "whisper", "mm_budget": (compute, cache)}
    return {"target": "vision", "mm_budget": (compute, cache), "disable_chunked_mm_input": whole}


def ec_connector(rng: random.Random, settings: dict) -> dict:
    """An encoder-cache connector (the seeded stand-in, docs/scheduling.md
    §4.20) beside half the vision models: images loaded from elsewhere,
    requests waiting for theirs, requests it can no longer serve."""
    if settings.get("target") != "vision" or rng.random() >= 0.5:
        return {}
    seed = rng.randrange(2**32)
    return {"ec_transfer_config": ec_transfer_config(seed, EcShares.draw(rng))}


def sampling_masks(rng: random.Random, settings: dict) -> dict:
    """--return-sampling-mask in some workloads (drawn apart): the runner
    returns each sample's token support, which each output carries for the
    tokens it keeps. Not with Whisper, which vLLM runs on its V1 runner only
    (masks come from V2's)."""
    drawn = random.Random(rng.random()).random() < 0.25
    runner_v1 = settings.get("target") == "whisper" or method_of(settings) in RUNNER_V1_METHODS
    return {"return_sampling_mask": True} if drawn and not runner_v1 else {}


def routed_experts(rng: random.Random, settings: dict) -> dict:
    """--enable-return-routed-experts in some workloads (drawn apart): each
    output carries its tokens' routed experts, and each step's metadata the
    block hashes the workers keep them by, the finished requests' blocks
    retained and released (vLLM's auxiliary-output connector), and prefix
    hits capped where the workers hold no routing (which only a hit
    without full attention can pass: Mamba alone). vLLM builds it for a
    generating model with prefix caching, on its V2 runner."""
    drawn = random.Random(rng.random()).random() < 0.3
    fits = (
        settings["enable_prefix_caching"]
        and settings["kv_layout"] != "none"
        and settings.get("runner") != "pooling"
        and not settings.get("mm_encoder_only")
        and settings.get("target") != "whisper"
        and method_of(settings) not in RUNNER_V1_METHODS
    )
    return {"return_routed_experts": True} if drawn and fits else {}


def prompt_embeddings(rng: random.Random) -> dict:
    """--enable-prompt-embeds in some workloads: some requests then give
    their prompt as embeddings, alone or mixed with token ids."""
    return {"enable_prompt_embeds": True} if rng.random() < 0.25 else {}


def pooling(rng: random.Random, settings: dict) -> dict:
    """An embedding model (--runner pooling) in about a quarter of the
    workloads: prompts only, each finished by its pooled result. Not with a
    drafter (vLLM builds none for a pooling model) nor on the vision target."""
    if rng.random() >= 0.6 or "speculative_config" in settings or "target" in settings:
        return {}
    return {"runner": "pooling"}


EMBED_DIM = 8


def embeds_for(rng: random.Random, tokens: list[int]) -> tuple[torch.Tensor, list[bool] | None]:
    """Embeddings for a prompt, each row fixed by its token (so shared
    prefixes embed alike and hit), or a random row now and then (a prefix
    that only looks shared); in some, token ids at random positions beside
    them (vLLM's mixed prompts)."""
    rows = [
        torch.full((EMBED_DIM,), float(t)) if rng.random() < 0.95 else torch.randn(EMBED_DIM)
        for t in tokens
    ]
    mixed = [rng.random() < 0.5 for _ in tokens] if rng.random() < 0.4 else None
    return torch.stack(rows), mixed


def kv_metrics(rng: random.Random) -> dict:
    """KV-cache residency metrics on in some workloads; vLLM's other
    observability options in some (drawn apart, so the rest stays each
    seed's): MFU metrics and iteration details (per-request speculative
    decoding metrics come with speculation, ``spec_metrics``)."""
    metrics = rng.random() < 0.35
    other = random.Random(rng.random())
    options = {
        "enable_mfu_metrics": other.random() < 0.3,
        "enable_logging_iteration_details": other.random() < 0.3,
    }
    if not metrics and not any(options.values()):
        return {}
    return {"observability_config": ObservabilityConfig(kv_cache_metrics=metrics, **options)}


def spec_metrics(rng: random.Random, settings: dict) -> None:
    """Per-request speculative-decoding metrics (basic or detailed) in some
    workloads that speculate (vLLM refuses them without speculation)."""
    level = random.Random(rng.random()).choice(["none", "none", "basic", "detailed"])
    if "speculative_config" not in settings or level == "none":
        return
    config = settings.get("observability_config") or ObservabilityConfig()
    config.per_request_spec_decode_metrics = level
    settings["observability_config"] = config


def kv_events(rng: random.Random) -> dict:
    """KV-cache events on in some workloads (published to a recorder)."""
    if rng.random() < 0.4:
        return {"kv_events_config": KVEventsConfig(enable_kv_cache_events=True, publisher="null")}
    return {}


@dataclass(frozen=True)
class Features:
    """What a workload's requests and runner do, beyond its settings."""

    runner_v1: bool  # model runner V1's output shapes (else V2's)
    reasoning: bool  # a reasoning parser that reads all_token_ids
    grammars: bool  # structured-output requests
    sessions: bool  # streaming-input sessions
    repeating: bool  # outputs that often repeat a token


def workload_features(rng: random.Random, settings: dict) -> Features:
    pp, async_scheduling = settings["pipeline_parallel_size"], settings["async_scheduling"]
    need = -(-settings["max_model_len"] // settings["block_size"])
    # A pooling model's requests sample nothing: no grammars, no sessions;
    # nor an encoder-only deployment's (vLLM refuses its sessions).
    generates = settings.get("runner") != "pooling" and not settings.get("mm_encoder_only")
    # vLLM runs an encoder-decoder on model runner V1 only; no sessions.
    whisper = settings.get("target") == "whisper"
    return Features(
        # vLLM refuses async scheduling with pipeline parallelism, or with
        # n-gram speculation, on its V1 runner.
        runner_v1=(rng.random() < 0.3 or whisper or method_of(settings) in RUNNER_V1_METHODS)
        and not (async_scheduling and (pp > 1 or "speculative_config" in settings))
        # vLLM returns sampling masks from its V2 runner only, and runs
        # DSpark on it only.
        and not settings.get("return_sampling_mask")
        and not settings.get("return_routed_experts")
        and method_of(settings) != "dspark",
        reasoning=rng.random() < 0.3,
        grammars=rng.random() < 0.5 and generates,
        # Streaming sessions hold their blocks between turns and nobody
        # preempts them: vLLM stalls when they hold the whole cache, so they
        # come only with room for them, and stay well inside max_model_len.
        sessions=settings["num_blocks"] >= 3 * need
        and rng.random() < 0.6
        and generates
        and not whisper
        # vLLM itself trips its own session assertion (keep_end) when a
        # session speculates under pipeline parallelism.
        and not (pp > 1 and "speculative_config" in settings),
        repeating=rng.random() < 0.3,
    )


def run_workload(seed: int, steps: int = 60) -> Counter:
    rng = random.Random(seed)
    settings = random_settings(rng)
    features = workload_features(rng, settings)
    pp = settings["pipeline_parallel_size"]
    async_scheduling = settings["async_scheduling"]
    pair = VllmPair(
        rng, model_runner_v1=features.runner_v1, reasoning=features.reasoning, **settings
    )
    grammars, sessions, repeating = features.grammars, features.sessions, features.repeating
    session_ids: list[str] = []
    chunks: dict[str, int] = {}
    max_len = settings["max_model_len"]
    # Every request must fit the cache alone, its drafts and a drafter's
    # lookahead slots too, or vLLM itself never finishes it (it preempts
    # itself, recomputes, and gets drafts again).
    vc = pair.vllm.vllm_config
    room = vc.num_speculative_tokens + vc.num_lookahead_tokens
    # Each KV-cache group holds its own blocks for the request.
    groups = len(pair.vllm.kv_cache_config.kv_cache_groups)
    # (Without a KV cache, only max_model_len bounds a request.)
    per_group = (settings["num_blocks"] - 1) // groups if groups else max_len
    whisper = settings.get("target") == "whisper"
    if whisper:  # the decoder's blocks, beside a step's encoder tokens
        per_group = (
            settings["num_blocks"] - 1 - -(-settings["mm_budget"][0] // settings["block_size"])
        )
    capacity = min(max_len, per_group * settings["block_size"] - room)
    prefixes = [[rng.randrange(3, VOCAB) for _ in range(max_len)] for _ in range(3)]
    # LoRA: up to 8 adapters, more than max_loras in most workloads; most
    # requests take one, the rest the base model.
    adapters = rng.randint(1, 8) if "lora_config" in settings else 0

    def adapter() -> LoRARequest | None:
        if not adapters or rng.random() < 0.2:
            return None
        i = rng.randint(1, adapters)
        return LoRARequest(f"adapter-{i}", i, f"/adapters/{i}")

    # Images: a pool of identifiers, each with its placeholder count (and,
    # in some, break tokens that take no embedding), shared across requests.
    vision = settings.get("target") == "vision"
    pooled = settings.get("runner") == "pooling"
    images = image_pool(rng, settings, step_room(pair)) if vision else []

    # Audio for an encoder-decoder: a clip (of the budget at most) at
    # position 0 for the encoder, apart from the decoder's prompt.
    most_audio = min(settings["mm_budget"]) if whisper else 0

    def with_images(prompt: list[int]) -> tuple[list[int], list[MultiModalFeatureSpec]]:
        if whisper:
            if rng.random() < 0.1:
                return prompt, []
            length = rng.choice([1, most_audio, rng.randint(1, most_audio)])
            return prompt, [audio_feature(f"audio-{rng.randint(0, 9)}", length)]
        if not images:
            return prompt, []
        return prompt, place_images(rng, prompt, images)

    live: list[str] = []
    next_id = 0

    def choose() -> int:
        x = rng.random()
        if repeating and x > 0.5:
            return 9
        if grammars and x > 0.9:  # reasoning ends, grammars reject
            return THINK_END if x > 0.92 else REJECTED
        return EOS if x < 0.04 else STOP if x < 0.06 else rng.randrange(3, VOCAB)

    pair.choose = choose

    # A coordinated data-parallel engine holds prefills on the steps between
    # its cadence steps (its step counter, as DPEngineCoreProc keeps it).
    interval = settings["prefill_schedule_interval"]
    dp_throttle = settings["data_parallel_size"] > 1 and interval > 1
    counter = [0]

    def step() -> None:
        pair.schedule(throttle_prefills=dp_throttle and counter[0] % interval != 0)
        counter[0] += 1
        pair.events["throttled"] += dp_throttle and counter[0] % interval != 1
        n = len(pair.in_flight)
        if pp > 1:
            # The batch queue of pipeline parallelism: pp steps (pp + 1 async).
            update = n >= pp + async_scheduling or rng.random() < 0.2
        elif async_scheduling:
            # The engine's batch queue holds two; deeper queues (as pipeline
            # parallelism has) make preempted requests wait for stale output.
            update = n >= 3 or (n == 2 and rng.random() < 0.8) or (n == 1 and rng.random() < 0.2)
        else:
            update = True
        if update:
            pair.update_oldest(choose)

    for _ in range(steps):
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            # A session (short, so its chunks stay inside max_model_len).
            resumable = sessions and len(session_ids) < 3 and rng.random() < 0.3
            plen = rng.randint(1, capacity // 8 if resumable else capacity // 2)
            if pooled and rng.random() < 0.1:
                plen = capacity  # a pooled prompt may fill max_model_len
            shared = rng.randint(0, plen)
            prompt = rng.choice(prefixes)[:shared] + [
                rng.randrange(3, VOCAB) for _ in range(plen - shared)
            ]
            rid = f"r{next_id}"
            next_id += 1
            prompt, features = with_images(prompt)
            embeds: dict = {}
            if settings.get("enable_prompt_embeds") and not resumable and rng.random() < 0.4:
                embeds["prompt_embeds"], embeds["prompt_is_token_ids"] = embeds_for(rng, prompt)
                pair.events["prompt_embeds"] += 1
            if pooled:
                # Token-level tasks skip reading the prefix cache.
                params = PoolingParams(
                    task="embed", skip_reading_prefix_cache=rng.random() < 0.2 or None
                )
                pair.add(
                    rid,
                    prompt,
                    pooling_params=params,
                    priority=rng.randint(0, 3),
                    arrival_time=float(next_id // 3),
                    cache_salt=rng.choice([None, None, None, "tenant"]),
                    client_index=rng.choice([0, 0, 0, 1]),
                    lora_request=adapter(),
                    **embeds,
                )
                live.append(rid)
                continue
            pair.add(
                rid,
                prompt,
                max_tokens=rng.randint(1, 8 if resumable else capacity - plen),
                ignore_eos=rng.random() < 0.3,
                stop_token_ids=[STOP] if rng.random() < 0.3 else [],
                repetition_detection=REPEATS if rng.random() < 0.3 else None,
                # Prompt logprobs: vLLM skips reading the prefix cache.
                prompt_logprobs=1 if rng.random() < 0.15 else None,
                priority=rng.randint(0, 3),
                arrival_time=float(next_id // 3),
                cache_salt=rng.choice([None, None, None, "tenant"]),
                client_index=rng.choice([0, 0, 0, 1]),
                grammar=grammars and rng.random() < 0.4,
                # KV-aware routers may ask for every hit as BlockStored.
                extra_args={"kv_cache_report_mode": "full"} if rng.random() < 0.15 else None,
                resumable=resumable,
                lora_request=adapter(),
                mm_features=features,
                **embeds,
            )
            live.append(rid)
            if resumable:
                session_ids.append(rid)
        # Sessions get their next chunks at any time (queued while a turn
        # runs), with arrival times that may reorder a priority heap in place;
        # a chunk that is not resumable ends the input.
        for rid in list(session_ids):
            r = pair.vllm.requests.get(rid)
            if r is None:
                session_ids.remove(rid)
            elif rng.random() < 0.15:
                # At most three chunks of up to 14 tokens with their outputs.
                chunks[rid] = chunks.get(rid, 0) + 1
                last = rng.random() < 0.2 or chunks[rid] > 3
                prompt = (
                    [0] if last else [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 6))]
                )
                # On a vision model, a short clip in some chunks (one of
                # three identifiers, so sessions share them now and then).
                clip: list[MultiModalFeatureSpec] = []
                if vision and not last and rng.random() < 0.4:
                    length, pos = rng.randint(1, 6), rng.randint(0, 2)
                    prompt = [rng.randrange(3, VOCAB) for _ in range(pos + length + 1)]
                    prompt[pos : pos + length] = [IMAGE] * length
                    clip = [image_feature(f"clip-{rng.randint(0, 2)}-{length}", pos, length, None)]
                    pair.events["session_images"] += 1
                pair.add_chunk(
                    rid,
                    prompt,
                    resumable=not last,
                    max_tokens=rng.randint(1, 8),
                    arrival_time=float(rng.randint(0, next_id)),
                    mm_features=clip,
                )
        for rid in list(pair.compiling):  # grammars compile in their own time
            if rng.random() < 0.3:
                pair.resolve_grammar(rid, compiled=rng.random() < 0.85)
        if live and rng.random() < 0.08:
            pair.abort(rng.sample(live, min(len(live), rng.randint(1, 3))))
        if rng.random() < 0.02:
            pair.reset_prefix_cache(reset_running_requests=rng.random() < 0.5)
        if rng.random() < 0.03:
            pair.set_pause_state(rng.choice(list(PauseState)))
        step()
    # Drain: with arrivals over, everything finishes.
    pair.set_pause_state(PauseState.UNPAUSED)
    for rid in list(pair.compiling):
        pair.resolve_grammar(rid, compiled=True)
    for rid in session_ids:  # every session's input ends
        if rid in pair.vllm.requests:
            pair.add_chunk(rid, [0], resumable=False)
    # Pipeline parallelism spaces a request's decodes pp steps apart.
    idle = 0
    seen: dict[tuple, int] = {}  # state -> preemptions when it was seen
    # Drain steps in a row that changed nothing and scheduled nothing.
    frozen, last_state = 0, None
    for _ in range(30 * max_len * pp):
        if not pair.vllm.has_requests() and not pair.in_flight:
            break
        state = livelock_state(pair)
        frozen = frozen + 1 if state == last_state and not scheduled_any(pair) else 0
        last_state = state
        if frozen > 4 * (interval + pp):
            # vLLM's own stall, reproduced: requests nothing can be
            # scheduled for (multi-module MTP's read-ahead forbids the only
            # chunk end the block-aligned split of cached states allows)
            # and nothing else to run. Their clients give up.
            pair.events["vllm_stalled"] += 1
            pair.abort(sorted(pair.vllm.requests))
            frozen = 0
            continue
        if seen.get(state, pair.events["preempted"]) < pair.events["preempted"]:
            # vLLM's own livelock, reproduced: the same requests, statuses
            # and counts again, with preemptions between and nothing
            # sampled or finished (a pool too tight for two requests that
            # preempt each other in turn, recomputing from scratch; a
            # cadence or a stagger repeats states without preempting).
            # Their clients give up.
            pair.events["vllm_livelock"] += 1
            pair.abort(sorted(pair.vllm.requests))
            seen.clear()
            continue
        seen[state] = pair.events["preempted"]
        if pair.vllm.has_requests():
            step()
        else:
            pair.update_oldest(choose)
        idle = idle + 1 if not pair.vllm.running and not scheduled_any(pair) else 0
        if idle > interval + 3 and stalled_sessions(pair):
            # vLLM's own deadlock, reproduced: sessions that hold their blocks
            # between turns, with too few blocks left for any of them to
            # extend, and nothing running to preempt. Their clients give up.
            pair.events["sessions_stalled"] += 1
            pair.abort(stalled_sessions(pair))
            idle = 0
    assert not pair.vllm.has_requests() and not pair.in_flight, "no progress"
    if pair.vllm.ec_connector is not None:
        theirs, ours = pair.vllm.ec_connector.stand_in, pair.ours.ec_connector.stand_in
        assert ours.log == theirs.log, "the encoder-cache connector was called differently"
        pair.events.update(ours.events)
    return pair.events


IMAGE = 5  # the placeholder token (the scheduler never reads its value)


def place_images(
    rng: random.Random, prompt: list[int], images: list[tuple[str, int, list[bool] | None]]
) -> list[MultiModalFeatureSpec]:
    """Up to three images from ``images`` put into ``prompt`` (its tokens
    there become placeholders), as vLLM's processor hands them over."""
    features: list[MultiModalFeatureSpec] = []
    pos = rng.randint(0, 4)
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        identifier, length, mask = rng.choice(images)
        if pos + length >= len(prompt):
            break
        prompt[pos : pos + length] = [IMAGE] * length
        features.append(image_feature(identifier, pos, length, mask))
        pos += length + rng.randint(0, 6)
    return features


def step_room(pair: VllmPair) -> int:
    """The most tokens an unchunked image can take in a step: the token
    budget, and the input budget less a drafter's slots; less one more with
    an EAGLE-style drafter, whose read-ahead stops a chunk a token before an
    image it cannot cover, which then needs its length plus that token."""
    vc = pair.vllm.vllm_config
    sc, spec = vc.scheduler_config, vc.speculative_config
    slots = 0 if spec is None else spec.max_num_new_slots_for_drafting
    scheduled = sc.max_num_scheduled_tokens or sc.max_num_batched_tokens
    return min(scheduled, sc.max_num_batched_tokens - slots) - vc.num_prefill_lookahead_tokens


def image_pool(
    rng: random.Random, settings: dict, room: int
) -> list[tuple[str, int, list[bool] | None]]:
    """Identifiers with their placeholder counts, around the block size and
    the encoder budget, never past what vLLM can ever encode (the budget,
    the cache and, unchunked, what one step gives a request: ``room``;
    vLLM checks only the batch budget, and an image past a drafter's share
    of it never runs)."""
    compute, cache = settings["mm_budget"]
    most = min(compute, cache)
    if settings["disable_chunked_mm_input"]:
        most = min(most, room)
    bs = settings["block_size"]
    pool = []
    for i in range(rng.randint(2, 8)):
        length = max(1, min(most, rng.choice([1, bs - 1, bs, bs + 1, most, rng.randint(1, most)])))
        # Some items frame their embeddings with tokens that take none.
        mask = [0 < k < length - 1 for k in range(length)] if length > 2 and i % 3 == 0 else None
        pool.append((f"img-{i}", length, mask))
    return pool


def image_feature(
    identifier: str, offset: int, length: int, mask: list[bool] | None
) -> MultiModalFeatureSpec:
    """An image as vLLM's processor hands it over (its data a stand-in the
    V2 runner's updates carry)."""
    is_embed = None if mask is None else torch.tensor(mask)
    return MultiModalFeatureSpec(
        data=MultiModalKwargsItem({}),
        modality="image",
        identifier=identifier,
        mm_position=PlaceholderRange(offset=offset, length=length, is_embed=is_embed),
    )


def audio_feature(identifier: str, length: int) -> MultiModalFeatureSpec:
    """An audio clip as vLLM's processor hands it to an encoder-decoder:
    the encoder's ``length`` tokens, at position 0."""
    return MultiModalFeatureSpec(
        data=MultiModalKwargsItem({}),
        modality="audio",
        identifier=identifier,
        mm_position=PlaceholderRange(offset=0, length=length),
    )


def scheduled_any(pair: VllmPair) -> bool:
    """Whether a step still in flight scheduled tokens (its output changes something)."""
    return any(a.total_num_scheduled_tokens for a, _, _ in pair.in_flight)


def stalled_sessions(pair: VllmPair) -> list[str]:
    """The waiting requests that hold KV blocks, when all are streaming
    sessions between turns (none when another kind holds blocks: a stall of
    that kind is a failure)."""
    holders = list(pair.vllm.kv_holding_waiting)
    if not holders or any(r.streaming_queue is None for r in holders):
        return []
    return [r.request_id for r in holders]


def drawn_features(seed: int) -> Counter:
    """The features a workload's seed draws (its settings and Features),
    one count each, named as the tests below name them."""
    rng = random.Random(seed)
    s = random_settings(rng)
    f = workload_features(rng, s)
    windowed = s["kv_layout"] in WINDOW_LAYOUTS
    recurrent = s["kv_layout"] in RECURRENT_GROUPS
    drawn = {
        "structured outputs": f.grammars,
        "streaming sessions": f.sessions,
        "KV-cache events": "kv_events_config" in s,
        "KV-cache metrics": "observability_config" in s
        and s["observability_config"].kv_cache_metrics,
        "observability options": "observability_config" in s
        and (
            s["observability_config"].enable_mfu_metrics
            or s["observability_config"].enable_logging_iteration_details
            or s["observability_config"].per_request_spec_decode_metrics != "none"
        ),
        "pipeline parallelism": s["pipeline_parallel_size"] > 1,
        "data parallelism": s["data_parallel_size"] > 1,
        "local prefill cadence": s["data_parallel_size"] == 1
        and s["prefill_schedule_interval"] > 1,
        "async scheduling": s["async_scheduling"],
        "priority policy": s["policy"] == "priority",
        "MLA": s["mla"],
        "window KV-cache groups": windowed,
        "recurrent-state groups": recurrent,
        "recurrent-state groups with speculation": recurrent and "speculative_config" in s,
        "recurrent states cached": recurrent and s["enable_prefix_caching"],
        "recurrent states with prefill checkpoints": recurrent
        and s["enable_prefix_caching"]
        and s.get("mamba_checkpoint_alignment") is not None,
        "decode context parallelism": s.get("decode_context_parallel_size", 1) > 1,
        "groups of different block sizes": "window_block_size" in s or "full_block_size" in s,
        "chunked-local groups of different block sizes": s["kv_layout"] == "llama4"
        and ("window_block_size" in s or "full_block_size" in s),
        "encoder-decoder groups of different block sizes": "cross_block_size" in s
        or (s.get("target") == "whisper" and "full_block_size" in s),
        "recurrent groups of unlike specs": not s.get("mamba_specs_alike", True),
        "multi-module MTP beside cached recurrent states": recurrent
        and s["enable_prefix_caching"]
        and s.get("num_mtp_layers", 1) > 1,
        "multi-module MTP with EAGLE's drop beside cached recurrent states": recurrent
        and s["enable_prefix_caching"]
        and s.get("num_mtp_layers", 1) > 1
        and bool(s.get("speculative_config", {}).get("disable_lookahead_block_hashes")),
        "groups of different block sizes beside uncached recurrent states": recurrent
        and not s["enable_prefix_caching"]
        and ("window_block_size" in s or "full_block_size" in s),
        "EAGLE last-block drop beside recurrent states": recurrent
        and bool(s.get("speculative_config", {}).get("disable_lookahead_block_hashes")),
        "groups of different block sizes with multi-module MTP": s.get("num_mtp_layers", 1) > 1
        and ("window_block_size" in s or "full_block_size" in s),
        "recurrent states smaller than attention blocks": recurrent
        and s["enable_prefix_caching"]
        and ("window_block_size" in s or "full_block_size" in s),
        "groups of different block sizes with KV-cache events": (
            "window_block_size" in s or "full_block_size" in s
        )
        and "kv_events_config" in s,
        "window retention interval": bool(s.get("retention_interval")),
        "encoder-decoder with speculation": s.get("target") == "whisper"
        and "speculative_config" in s,
        "encoder-decoder with a drafter model": s.get("target") == "whisper"
        and method_of(s) not in (None, "ngram", "ngram_gpu"),
        "encoder-decoder with KV-cache events or metrics": s.get("target") == "whisper"
        and ("kv_events_config" in s or "observability_config" in s),
        "window groups with speculation": windowed and "speculative_config" in s,
        "window groups with KV-cache events": windowed and "kv_events_config" in s,
        "window groups with KV-cache metrics": windowed
        and "observability_config" in s
        and s["observability_config"].kv_cache_metrics,
        "speculative decoding": "speculative_config" in s,
        "LoRA": "lora_config" in s,
        "images": s.get("target") == "vision",
        "encoder-cache connector": "ec_transfer_config" in s,
        "encoder-decoder": s.get("target") == "whisper",
        "prompt embeddings": bool(s.get("enable_prompt_embeds")),
        "sampling masks": bool(s.get("return_sampling_mask")),
        "routed experts": bool(s.get("return_routed_experts")),
        "routed experts without full attention": bool(s.get("return_routed_experts"))
        and s["kv_layout"] == "mamba",
        "pooling": s.get("runner") == "pooling",
        "no KV cache": s["kv_layout"] == "none",
        "encoder only": bool(s.get("mm_encoder_only")),
    }
    if s["kv_layout"] not in ("full", "none"):
        drawn[f"layout: {s['kv_layout']}"] = True
    if "speculative_config" in s:
        drawn[f"speculation: {s['speculative_config']['method']}"] = True
        dynamic = "num_speculative_tokens_per_batch_size" in s["speculative_config"]
        drawn["dynamic speculation lengths"] = dynamic
        drawn["multi-module MTP"] = s.get("num_mtp_layers", 1) > 1
        drawn["multi-module MTP with window groups"] = (
            s.get("num_mtp_layers", 1) > 1 and s["kv_layout"] in WINDOW_LAYOUTS
        )
        drawn["multi-module MTP beside recurrent states"] = (
            s.get("num_mtp_layers", 1) > 1 and s["kv_layout"] in RECURRENT_GROUPS
        )
        drawn["EAGLE last-block drop"] = bool(
            s["speculative_config"].get("disable_lookahead_block_hashes")
            and s["enable_prefix_caching"]
        )
        # Drafters whose block hashes cover the token after each block
        # (vLLM's num_hash_lookahead_tokens), where hashes are kept.
        drawn["lookahead block hashes"] = (
            s["speculative_config"]["method"] in ("eagle", "eagle3", "mtp", "draft_model")
            and not s["speculative_config"].get("disable_lookahead_block_hashes")
            and s["enable_prefix_caching"]
        )
        drawn["EAGLE last-block drop beside window groups"] = (
            drawn["EAGLE last-block drop"] and s["kv_layout"] in WINDOW_LAYOUTS
        )
        drawn["EAGLE last-block drop beside groups of different block sizes"] = drawn[
            "EAGLE last-block drop"
        ] and ("window_block_size" in s or "full_block_size" in s)
    return Counter({f"feature: {k}": 1 for k, v in drawn.items() if v})


# What 1,040 workloads draw at least, on average: each feature 200, each
# window layout 40, each speculative method 39 (below), speculation and window
# groups 300, the encoder-decoder (only beside one decoder group, without
# speculation) 40, no KV cache 60, an encoder-only deployment (one group's
# worth, without speculation or pooling) 25, and multi-module MTP (MTP's three
# modules with 2 or 3 drafts, at most the block size) 9, beside window groups
# 2; window groups with KV-cache events, and with KV-cache metrics, 100 each;
# a window retention interval above 0, 40; decode context parallelism (one
# full-attention group, no KV-cache events) 80; window groups with speculation
# 120; the encoder-decoder with KV-cache events or metrics 20, with n-gram
# speculation 9; recurrent-state groups 100 (Qwen3-Next's layout 35, the
# others 15 each), with speculation 30, with prefix caching on (vLLM's
# "align") 35, with Mamba2's prefill checkpoints 20; routed experts (prefix
# caching on, a generating model on model runner V2 beside a full-attention
# group) 90; pooling 180 and EAGLE's last-block drop 30, beside window groups
# 3 (about four standard deviations under what the draws give: 213, 56 and 20
# of 1,040; 19, 14 and 5 for multi-module MTP, the encoder-decoder with
# speculation and MTP beside windows; encoder-only's 31, Qwen3-Next's 48 and
# routed experts' 136).
FEATURE_SHARES = {
    # About 2 to 4 of 1,040 (routed experts on the Mamba-alone layout).
    "feature: routed experts without full attention": 1,
    "feature: speculative decoding": 300,
    "feature: window KV-cache groups": 300,
    "feature: encoder-decoder": 40,
    "feature: no KV cache": 60,
    "feature: encoder only": 25,
    "feature: pooling": 180,
    "feature: routed experts": 90,
    "feature: encoder-cache connector": 40,
    "feature: dynamic speculation lengths": 40,
    "feature: EAGLE last-block drop": 30,
    "feature: EAGLE last-block drop beside window groups": 3,
    # About 91 of 1,040 (EAGLE, EAGLE-3, MTP and draft models with prefix
    # caching on and their hashes kept).
    "feature: lookahead block hashes": 50,
    # About 8 of 1,040 (in the gpt-oss and Gemma 3 layouts).
    "feature: EAGLE last-block drop beside groups of different block sizes": 2,
    "feature: multi-module MTP": 9,
    "feature: multi-module MTP with window groups": 2,
    # About 2 of 1,040 (recurrent layouts, prefix caching off).
    "feature: multi-module MTP beside recurrent states": 1,
    # Each of eleven methods: about 48 (39 is four standard deviations
    # under, and still enough for every chunk to check it) ...
    **{f"feature: speculation: {m}": 39 for m in SPEC_METHODS},
    # ... but hidden-state extraction, not drawn beside pipeline
    # parallelism (n-gram lookup stands in there): about 38.
    "feature: speculation: extract_hidden_states": 30,
    "feature: window groups with KV-cache events": 100,
    "feature: window groups with KV-cache metrics": 100,
    "feature: window retention interval": 40,
    "feature: decode context parallelism": 80,
    # About 229 of 1,040 (half the gpt-oss, Gemma 3 and Llama 4 layouts
    # and of the recurrent ones with attention and prefix caching on,
    # without multi-module MTP), 91 of them with KV-cache events, 42 of
    # them Llama 4's, 16 with EAGLE's drop.
    "feature: groups of different block sizes": 100,
    "feature: chunked-local groups of different block sizes": 30,
    # About 43 of 1,040 (half the Whisper workloads).
    "feature: encoder-decoder groups of different block sizes": 30,
    "feature: groups of different block sizes with KV-cache events": 30,
    "feature: recurrent states smaller than attention blocks": 12,
    "feature: window groups with speculation": 120,
    "feature: encoder-decoder with KV-cache events or metrics": 20,
    "feature: encoder-decoder with speculation": 9,
    # About 25 of 1,040 (Whisper with EAGLE, a draft model, DFlash, ...).
    "feature: encoder-decoder with a drafter model": 15,
    "feature: recurrent-state groups": 100,
    "feature: recurrent-state groups with speculation": 30,
    "feature: recurrent states cached": 35,
    "feature: recurrent states with prefill checkpoints": 20,
    # About 11 of 1,040 (half the Qwen3-Next layouts with prefix caching on).
    "feature: recurrent groups of unlike specs": 6,
    # About 5 of 1,040 (DeepSeek's three MTP modules beside cached states:
    # half of them stall as vLLM does, and both give up on them alike), 3
    # of them with EAGLE's drop.
    "feature: multi-module MTP beside cached recurrent states": 1,
    "feature: multi-module MTP with EAGLE's drop beside cached recurrent states": 1,
    # About 23 of 1,040 (half the recurrent layouts with attention and
    # prefix caching off).
    "feature: groups of different block sizes beside uncached recurrent states": 12,
    # About 10 of 1,040 (a recurrent layout in a third of the drop's
    # workloads with one full-attention group).
    "feature: EAGLE last-block drop beside recurrent states": 5,
    # About 3 of 1,040 (DeepSeek's three MTP modules beside gpt-oss's or
    # Gemma 3's layout, half of those with larger blocks).
    "feature: groups of different block sizes with multi-module MTP": 1,
    "feature: layout: qwen3-next": 35,
    "feature: layout: jamba": 15,
    "feature: layout: swa-mamba": 15,
    "feature: layout: mamba": 15,
}


def feature_need(name: str) -> int:
    """How many of 1,040 workloads draw the feature ``name``, at least."""
    return FEATURE_SHARES.get(name, 40 if ": " in name.removeprefix("feature: ") else 200)


# The workloads a chunk may run at most (the seeded runs' reach).
CHUNK_REACH = REACH * FULL_WORKLOADS // CHUNKS


def checked_per_chunk(name: str) -> bool:
    """Whether a chunk must run the feature ``name`` itself: only a feature
    a chunk's reach draws 12 times or more on average, so that none misses
    it by chance (e^-12); the rarer ones run in test_rare_features_agree_with_vllm."""
    return feature_need(name) * CHUNK_REACH >= 12 * FULL_WORKLOADS


LAYOUTS = ("gpt-oss", "gemma3", "llama4", "qwen3-next", "jamba", "swa-mamba", "mamba")
WINDOW_LAYOUTS = ("gpt-oss", "gemma3", "llama4", "swa-mamba")
FEATURES = [
    *(f"feature: {k}" for k in ("structured outputs", "streaming sessions", "KV-cache events")),
    *(f"feature: {k}" for k in ("KV-cache metrics", "pipeline parallelism", "data parallelism")),
    *(f"feature: {k}" for k in ("local prefill cadence", "async scheduling", "priority policy")),
    *(f"feature: {k}" for k in ("MLA", "window KV-cache groups", "speculative decoding")),
    "feature: LoRA",
    "feature: observability options",
    "feature: images",
    "feature: encoder-cache connector",
    "feature: encoder-decoder",
    "feature: prompt embeddings",
    "feature: dynamic speculation lengths",
    "feature: EAGLE last-block drop",
    "feature: EAGLE last-block drop beside window groups",
    "feature: EAGLE last-block drop beside groups of different block sizes",
    "feature: lookahead block hashes",
    "feature: multi-module MTP",
    "feature: multi-module MTP with window groups",
    "feature: multi-module MTP beside recurrent states",
    "feature: window groups with KV-cache events",
    "feature: window groups with KV-cache metrics",
    "feature: window retention interval",
    "feature: decode context parallelism",
    "feature: groups of different block sizes",
    "feature: chunked-local groups of different block sizes",
    "feature: encoder-decoder groups of different block sizes",
    "feature: recurrent states smaller than attention blocks",
    "feature: groups of different block sizes with KV-cache events",
    "feature: window groups with speculation",
    "feature: recurrent-state groups",
    "feature: recurrent-state groups with speculation",
    "feature: recurrent states cached",
    "feature: recurrent states with prefill checkpoints",
    "feature: recurrent groups of unlike specs",
    "feature: multi-module MTP beside cached recurrent states",
    "feature: multi-module MTP with EAGLE's drop beside cached recurrent states",
    "feature: groups of different block sizes beside uncached recurrent states",
    "feature: EAGLE last-block drop beside recurrent states",
    "feature: groups of different block sizes with multi-module MTP",
    "feature: encoder-decoder with KV-cache events or metrics",
    "feature: encoder-decoder with speculation",
    "feature: encoder-decoder with a drafter model",
    "feature: sampling masks",
    "feature: routed experts",
    "feature: routed experts without full attention",
    "feature: pooling",
    "feature: no KV cache",
    "feature: encoder only",
    *(f"feature: layout: {k}" for k in LAYOUTS),
    *(f"feature: speculation: {m}" for m in SPEC_METHODS),
]


def test_each_feature_gets_its_share_of_workloads(workloads: Workloads) -> None:
    """The workloads draw their settings and features from their seed: over
    ten times the full size's seeds (cheap: nothing runs), each feature
    comes at least its share of 1,040 (``feature_need``), so a run of any
    size draws each about that often. The chunks below make sure this run
    really ran each."""
    counts: Counter = Counter()
    for seed in workloads.seeds(10 * FULL_WORKLOADS, 10 * FULL_WORKLOADS, "features"):
        counts += drawn_features(seed)
    assert set(counts) == set(FEATURES), counts
    for name in FEATURES:
        assert counts[name] >= 10 * feature_need(name), (name, counts)


# Workloads of each rare feature (checked_per_chunk false) a run goes
# through, the first its stream draws.
RARE_RUNS = 2


def test_rare_features_agree_with_vllm(workloads: Workloads) -> None:
    """The features too rare for every chunk (multi-module MTP, Whisper with
    speculation, each recurrent layout, ...): the first RARE_RUNS workloads
    of this run's stream that draw each run and agree with vLLM, so every
    run goes through each without a chunk chasing it by chance."""
    rare = [name for name in FEATURES if not checked_per_chunk(name)]
    found: dict[str, list[int]] = {name: [] for name in rare}
    for seed in workloads.seeds(10 * FULL_WORKLOADS, 10 * FULL_WORKLOADS, "rare"):
        drawn = drawn_features(seed)
        for name in rare:
            if drawn[name] and len(found[name]) < RARE_RUNS:
                found[name].append(seed)
        if all(len(seeds) == RARE_RUNS for seeds in found.values()):
            break
    assert all(len(seeds) == RARE_RUNS for seeds in found.values()), found
    for seed in sorted({seed for seeds in found.values() for seed in seeds}):
        try:
            run_workload(seed)
        except AssertionError as e:
            raise AssertionError(f"workload seed {seed}: {e}") from e


# Events each chunk of 80 workloads must see at least 10 times (fewer, in
# proportion, in a smaller chunk), and KV-cache resets at least once: a reset
# succeeds only with nothing held (or everything preempted), so it is rarer.
EVENTS = (
    *("preempted", "prefix_hits", "finished", "aborted", "placeholders", "skipped"),
    *("paused", "repetition", "skip_reading", "masked_rows", "masks_deferred"),
    *("grammar_failed", "grammar_rejected", "reasoning_ended"),
    *("kv_BlockStored", "kv_BlockRemoved", "kv_evictions"),
    *("throttled", "decode_staggered", "pp_token_ids", "session_turns", "session_chunks"),
    *("spec_drafts", "spec_accepted", "spec_verified", "spec_empty_slots"),
    *("lora_capped", "encoder_inputs", "encoder_evicted", "prompt_embeds", "pooled"),
    "session_images",
    "encoder_only_finished",
)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_workloads_agree_with_vllm(chunk: int, workloads: Workloads) -> None:
    per_run, full = WORKLOADS // CHUNKS, FULL_WORKLOADS // CHUNKS
    size = workloads.size(per_run, full)
    needs = {what: workloads.scaled(10, per_run, full) for what in EVENTS}
    needs["kv_AllBlocksCleared"] = 1
    # The workloads must really run what they claim to: each feature in its
    # share of them (``feature_need`` of 1,040) ...
    for name in FEATURES:
        if name.count(": ") == 1 and checked_per_chunk(name):
            needs[name] = -(-feature_need(name) * size // FULL_WORKLOADS)
    # ... and each chunk one speculative method and one window layout of its
    # own (rarer: all of them in every chunk would run twice its workloads),
    # 3 of 80 workloads, so a run covers each in two chunks or more.
    own = (SPEC_METHODS[chunk % len(SPEC_METHODS)], LAYOUTS[chunk % len(LAYOUTS)])
    for name in (f"feature: speculation: {own[0]}", f"feature: layout: {own[1]}"):
        if checked_per_chunk(name):
            needs[name] = workloads.scaled(3, per_run, full)

    def run(seed: int) -> Counter:
        return run_workload(seed) + drawn_features(seed) + Counter(workloads=1)

    events = workloads.run_covering(run, needs, per_run, full, part=f"chunk {chunk}")
    for what, n in needs.items():
        assert events[what] >= n, (what, n, events)


def three_mtp_modules(**settings: Any) -> VllmPair:
    """A pair serving DeepSeek's three MTP modules beside a recurrent
    layout's cached states (``settings``), blocks of 8, sampling 7."""
    settings = {
        "block_size": 8,
        "max_model_len": 64,
        "max_num_seqs": 4,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 3},
        "target": "deepseek_mtp",
        "mla": True,
        "num_mtp_layers": 3,
        "async_scheduling": False,
        **settings,
    }
    pair = VllmPair(random.Random(0), **settings)
    pair.choose = lambda: 7
    return pair


def test_multi_module_mtp_beside_cached_states_stalls_as_vllm_does() -> None:
    """vLLM's own stall, which the drop-in reproduces (docs/scheduling.md
    §7.15): DeepSeek's three MTP modules beside Jamba's cached states,
    blocks of 8, a budget of 8. A 9-token prompt's first chunk stops 3 short
    of its end (the drafter's read-ahead), at 6; the next chunk must stop
    at the block's end, 8, which lies inside that read-ahead, so nothing is
    ever scheduled again. The pair compares every step."""
    pair = three_mtp_modules(kv_layout="jamba", num_blocks=40, max_num_batched_tokens=8)
    pair.add("a", list(range(10, 19)), max_tokens=2)
    scheduled = []
    for _ in range(4):
        pair.schedule()
        scheduled.append(pair.in_flight[-1][0].num_scheduled_tokens.get("a", 0))
        pair.update_oldest()
    assert scheduled == [6, 0, 0, 0]
    assert pair.vllm.requests["a"].num_computed_tokens == 6


def test_eagle_drop_beside_multi_module_mtp_keys_no_state_inside_a_block() -> None:
    """DeepSeek's three MTP modules with EAGLE's last-block drop beside
    Qwen3-Next's cached states (docs/scheduling.md §7.15): states in blocks
    of 8, attention in blocks of 16. When the 41-token prompt's last chunk
    ends, the state groups may cache 39 tokens (41 less the two the
    modules may prefill again), a count inside a block, so vLLM keys no
    state there, not even the prompt's checkpoint at 32 (the drop's: 40 a
    block back). The output's prefill stats count no tokens cached; the
    pair compares them at every step."""
    pair = three_mtp_modules(
        kv_layout="qwen3-next",
        full_block_size=16,
        num_blocks=60,
        max_num_batched_tokens=24,
        speculative_config={
            "method": "mtp",
            "num_speculative_tokens": 3,
            "disable_lookahead_block_hashes": True,
        },
        retention_interval=0,
    )
    pair.add("a", list(range(10, 51)), max_tokens=2)
    scheduled = []
    for _ in range(3):
        pair.schedule()
        scheduled.append(pair.in_flight[-1][0].num_scheduled_tokens.get("a", 0))
        pair.update_oldest()
    assert scheduled == [24, 8, 9]
    assert pair.vllm.kv_cache_manager.estimate_cached_tokens(pair.vllm.requests["a"]) == 0
