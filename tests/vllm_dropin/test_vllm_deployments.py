"""The drop-in on the deployments people serve: for each row of a table of
``vllm serve`` command lines (model shapes and flags), vLLM's own CLI parser
and EngineCore build the engine with ``--scheduler-cls
ironbatch.vllm.Scheduler``, and the drop-in must be what EngineCore runs (no
fallback to vLLM's scheduler), and must then schedule a small mixed workload
exactly as vLLM's own engine does for the same command line.

How each row is built (``deployment_setup.py``, in a child process: vLLM's
platform and torch.distributed state are per process, and the other drop-in
tests run on vLLM's unspecified platform):

* a config.json shaped like the real model's, a small local tokenizer, no
  weights, no network (``HF_HUB_OFFLINE=1``);
* ``vllm serve``'s argument parser, ``AsyncEngineArgs.from_cli_args`` and
  ``create_engine_config`` on vLLM's CPU platform (``VLLM_TARGET_DEVICE=cpu``);
* the KV-cache specs from vLLM's model class built on the meta device;
* vLLM's EngineCore with an executor that stands in for the workers, so
  EngineCore itself sizes the KV cache, resolves the scheduler class and
  constructs it with its own arguments.

Each row runs in two flavours: ``cpu-host``, what ``vllm serve`` resolves on
this machine (the CPU platform turns async scheduling off, and without
Triton vLLM uses model runner V1), and ``gpu-defaults``, the same command
line with what a CUDA host resolves instead (async scheduling forced back
on, model runner V2), since that is where these deployments run. Both keep
the config's block size (16): no attention backend is built, so none
states the block size it prefers (the CPU backend's 128, say).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

pytest.importorskip("vllm")

HERE = Path(__file__).resolve().parent
DROP_IN = "ironbatch.vllm.scheduler.Scheduler"
FLAVORS = {
    # flavour: what the engine it builds must show (gpu-defaults sets async
    # scheduling itself: the check is that the engine kept it)
    "cpu-host": {"async_scheduling": False, "use_v2_model_runner": False},
    "gpu-defaults": {"async_scheduling": True, "use_v2_model_runner": True},
}


class Deployment(NamedTuple):
    """One row: a model shape (a key of ``deployment_models.MODELS``), the
    ``vllm serve`` flags, what the built engine must show for the row to be
    what it says, and what the workload must go through on it."""

    id: str
    model: str
    flags: list[str]
    expect: dict[str, Any]
    exercises: tuple[str, ...] = ()
    exercises_when_sync: tuple[str, ...] = ()  # only without async scheduling
    # The flavours it runs in: all, but for what vLLM builds on one only
    # (prefill context parallelism needs model runner V2, a GPU host's).
    flavors: tuple[str, ...] = ("cpu-host", "gpu-defaults")


KV_EVENTS = json.dumps({"enable_kv_cache_events": True, "publisher": "null"})  # binds no port
SPEC_NGRAM = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
)
# EAGLE-3 with its own drafter model, and DeepSeek-V3's MTP layer: drafters
# with a forward pass of their own (lookahead KV slots, block hashes that
# cover the next token).
SPEC_EAGLE3 = json.dumps(
    {"method": "eagle3", "model": "{models}/llama-3.1-8b-eagle3", "num_speculative_tokens": 3}
)
SPEC_MTP = json.dumps({"method": "mtp", "num_speculative_tokens": 1})
SPEC_QWEN3_NEXT_MTP = json.dumps({"method": "mtp", "num_speculative_tokens": 2})
SPEC_DSPARK = json.dumps({"method": "dspark", "model": "{models}/qwen3-8b-dspark"})
SPEC_GPT_OSS_EAGLE3 = json.dumps(
    {"method": "eagle3", "model": "{models}/gpt-oss-20b-eagle3", "num_speculative_tokens": 3}
)
SPEC_GPT_OSS_EAGLE3_DROP = json.dumps(
    {**json.loads(SPEC_GPT_OSS_EAGLE3), "disable_lookahead_block_hashes": True}
)


def kv_connector(name: str, role: str = "kv_both", **extra: Any) -> str:
    """A --kv-transfer-config naming one of vLLM's connectors."""
    config: dict[str, Any] = {"kv_connector": name, "kv_role": role}
    if extra:
        config["kv_connector_extra_config"] = extra
    return json.dumps(config)


EXAMPLE_STORE = "{models}/example-connector-store"  # its scheduler side looks for files here
EC_STORE = "{models}/ec-example-store"  # the encoder-cache example's, likewise


def ec_connector(role: str) -> str:
    """An --ec-transfer-config naming vLLM's example encoder-cache connector."""
    return json.dumps(
        {
            "ec_connector": "ECExampleConnector",
            "ec_role": role,
            "ec_connector_extra_config": {"shared_storage_path": EC_STORE},
        }
    )


TABLE = [
    Deployment(
        "llama-3.1-8b",
        "llama-3.1-8b",
        [],
        {"kv_groups": ["FullAttentionSpec"], "max_model_len": 131072, "is_moe": False},
    ),
    Deployment(
        "qwen3-8b-reasoning-parser",
        "qwen3-8b",
        ["--reasoning-parser", "qwen3"],
        {"reasoning_parser": "qwen3", "reasoner_cls": "Qwen3ParserReasoningAdapter"},
        # vLLM's own Qwen3 parser holds the grammar back until </think>.
        exercises=("still_reasoning", "reasoning_ended"),
    ),
    Deployment(
        "structured-outputs-xgrammar",
        "llama-3.1-8b",
        ["--structured-outputs-config", '{"backend": "xgrammar"}'],
        {"structured_outputs_backend": "xgrammar"},
    ),
    Deployment(
        "gpt-oss-20b",
        "gpt-oss-20b",
        [],
        # vLLM picks gpt-oss's reasoning parser itself; its alternating
        # sliding-window (128) and full layers make two KV-cache groups.
        {
            "reasoning_parser": "openai_gptoss",
            "is_moe": True,
            "kv_groups": ["SlidingWindowSpec", "FullAttentionSpec"],
        },
    ),
    Deployment(
        # gpt-oss's window groups with an EAGLE-3 drafter (lookahead block
        # hashes over both groups), KV-cache events (a BlockStored per
        # group) and KV-cache residency metrics.
        "gpt-oss-20b-eagle3-events-metrics",
        "gpt-oss-20b",
        ["--speculative-config", SPEC_GPT_OSS_EAGLE3, "--kv-events-config", KV_EVENTS]
        + ["--kv-cache-metrics"],
        {
            "kv_groups": ["SlidingWindowSpec", "FullAttentionSpec"],
            "num_speculative_tokens": 3,
            "num_hash_lookahead_tokens": 1,
            "kv_events": True,
            "kv_cache_metrics": True,
        },
        exercises=("spec_drafts",),
    ),
    Deployment(
        # ... with lookahead block hashes off: EAGLE's last-block drop, in
        # the group vLLM finds the drafter's layers in (full attention).
        "gpt-oss-20b-eagle3-block-drop",
        "gpt-oss-20b",
        ["--speculative-config", SPEC_GPT_OSS_EAGLE3_DROP],
        {
            "kv_groups": ["SlidingWindowSpec", "FullAttentionSpec"],
            "num_speculative_tokens": 3,
            "num_hash_lookahead_tokens": 0,
        },
        exercises=("spec_drafts",),
    ),
    Deployment(
        # ... and behind NIXL (a connector keeps the plain hashes: the drop
        # again), disaggregated prefill of a hybrid model with a drafter.
        "gpt-oss-20b-eagle3-nixl",
        "gpt-oss-20b",
        ["--speculative-config", SPEC_GPT_OSS_EAGLE3]
        + ["--kv-transfer-config", kv_connector("NixlConnector")],
        {
            "kv_groups": ["SlidingWindowSpec", "FullAttentionSpec"],
            "num_speculative_tokens": 3,
            "num_hash_lookahead_tokens": 0,
            "kv_connector": "NixlPullConnector",
        },
        exercises=("spec_drafts", "connector_metadata"),
    ),
    Deployment(
        # Step-3.5-Flash with its three MTP layers: multi-module MTP beside
        # four window groups (each keeps the blocks of the two tokens the
        # drafter may prefill again), lookahead hashes over three tokens.
        "step-3.5-flash-mtp3",
        "step-3.5-flash",
        ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 3})]
        + ["--max-model-len", "32768"],
        {
            "kv_groups": ["SlidingWindowSpec"] * 4 + ["FullAttentionSpec"],
            "num_speculative_tokens": 3,
            "num_hash_lookahead_tokens": 3,
        },
        exercises=("spec_drafts",),
    ),
    Deployment(
        # Five sliding-window layers to one full: six KV-cache groups.
        "gemma-3-12b",
        "gemma-3-12b",
        [],
        {"kv_groups": ["SlidingWindowSpec"] * 5 + ["FullAttentionSpec"]},
    ),
    Deployment(
        # Chunked local attention in three layers of four: four groups.
        "llama-4-scout-chunked-local",
        "llama-4-scout",
        [],
        {"kv_groups": ["ChunkedLocalAttentionSpec"] * 3 + ["FullAttentionSpec"]},
    ),
    Deployment(
        # ... with an fp8 KV cache that layer 0, a chunked one, skips: its
        # bf16 group fits 16 tokens in a page, the others 32. vLLM's prefix
        # lookup asserts beside chunked blocks smaller than others', so
        # prefix caching is off (docs/scheduling.md §7.16).
        "llama-4-scout-fp8-skip-layer-0-no-prefix-caching",
        "llama-4-scout",
        ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "0"]
        + ["--no-enable-prefix-caching"],
        {"needs_kv_cache_zeroing": True, "enable_prefix_caching": False},
    ),
    Deployment(
        # An fp8 KV cache whose window layers skip quantization: a
        # mixed-precision hybrid. The bf16 windows fit 32 tokens in the
        # pool's page, the fp8 full layers 64: groups of different block
        # sizes, hashed at 32, hits and caching on 64 (docs/scheduling.md
        # §7.16), new blocks zeroed.
        "gpt-oss-20b-fp8-skip-windows",
        "gpt-oss-20b",
        ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "sliding_window"],
        {"kv_groups": ["SlidingWindowSpec", "FullAttentionSpec"], "needs_kv_cache_zeroing": True},
    ),
    Deployment(
        # ... with an EAGLE-3 drafter (lookahead block hashes, per hash
        # block, seen through each group's block size).
        "gpt-oss-20b-fp8-skip-windows-eagle3",
        "gpt-oss-20b",
        ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "sliding_window"]
        + ["--speculative-config", SPEC_GPT_OSS_EAGLE3],
        {"needs_kv_cache_zeroing": True, "num_hash_lookahead_tokens": 1},
        exercises=("spec_drafts",),
    ),
    Deployment(
        # ... with lookahead block hashes off: EAGLE's last-block drop in
        # the full-attention group, of 64-token blocks, beside 32-token
        # windows (§7.16).
        "gpt-oss-20b-fp8-skip-windows-eagle3-block-drop",
        "gpt-oss-20b",
        ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "sliding_window"]
        + ["--speculative-config", SPEC_GPT_OSS_EAGLE3_DROP],
        {"group_block_sizes": [32, 64], "num_hash_lookahead_tokens": 0},
        exercises=("spec_drafts",),
    ),
    Deployment(
        # ... with EAGLE-3 behind NIXL (a connector drops the last block
        # too: its loads write whole blocks).
        "gpt-oss-20b-fp8-skip-windows-eagle3-nixl",
        "gpt-oss-20b",
        ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "sliding_window"]
        + ["--speculative-config", SPEC_GPT_OSS_EAGLE3]
        + ["--kv-transfer-config", kv_connector("NixlConnector")],
        {"kv_connector": "NixlPullConnector", "group_block_sizes": [32, 64]},
        exercises=("spec_drafts",),
    ),
    Deployment(
        # ... routed by its KV-cache events (llm-d): each group's stores in
        # its own block size, a prompt tail's key inside a 64-token block
        # stored and removed beside the block's own (§7.16).
        "gpt-oss-20b-fp8-skip-windows-kv-events",
        "gpt-oss-20b",
        ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "sliding_window"]
        + ["--kv-events-config", KV_EVENTS],
        {"kv_events": True, "group_block_sizes": [32, 64]},
        exercises=("kv_events",),
    ),
    Deployment(
        # ... skipping one layer only (layer 1, a full one): each group of
        # layers alike, 24 groups of two block sizes.
        "gpt-oss-20b-fp8-skip-layer-1",
        "gpt-oss-20b",
        ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "1"],
        {"needs_kv_cache_zeroing": True},
    ),
    Deployment(
        # ... with prefix caching off.
        "gpt-oss-20b-fp8-skip-windows-no-prefix-caching",
        "gpt-oss-20b",
        ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "sliding_window"]
        + ["--no-enable-prefix-caching"],
        {"needs_kv_cache_zeroing": True, "enable_prefix_caching": False},
    ),
    Deployment(
        # vLLM's own switch for hybrid models: the sliding layers keep their
        # whole KV cache, so the model has one full-attention group.
        "gpt-oss-20b-single-kv-group",
        "gpt-oss-20b",
        ["--disable-hybrid-kv-cache-manager"],
        {"reasoning_parser": "openai_gptoss", "kv_groups": ["FullAttentionSpec"]},
    ),
    Deployment(
        "deepseek-v2-lite-mla",
        "deepseek-v2-lite",
        [],
        {"use_mla": True, "kv_groups": ["MLAAttentionSpec"], "is_moe": True},
    ),
    Deployment(
        # Decode context parallelism: each of two ranks holds every other
        # token of a block's KV, so the scheduler's blocks are 32 tokens.
        "deepseek-v2-lite-tp2-dcp2",
        "deepseek-v2-lite",
        ["--tensor-parallel-size", "2", "--decode-context-parallel-size", "2"],
        {"use_mla": True, "tensor_parallel_size": 2, "decode_context_parallel_size": 2},
    ),
    Deployment(
        # Prefill context parallelism: the scheduler's blocks stay 16 tokens
        # (vLLM builds it on model runner V2 only: the GPU-defaults flavour).
        "llama-3.1-8b-pcp2",
        "llama-3.1-8b",
        ["--prefill-context-parallel-size", "2"],
        {"prefill_context_parallel_size": 2},
        flavors=("gpu-defaults",),
    ),
    Deployment(
        "qwen3-30b-a3b-moe",
        "qwen3-30b-a3b",
        [],
        {"is_moe": True, "kv_groups": ["FullAttentionSpec"]},
    ),
    Deployment(
        "kv-events",
        "llama-3.1-8b",
        ["--kv-events-config", KV_EVENTS],
        {"kv_events": True, "kv_event_publisher": "NullEventPublisher"},
        exercises=("kv_events",),
    ),
    Deployment(
        # A dense model's DP ranks are independent engines: each one's
        # scheduler sees DP size 1.
        "data-parallel-2",
        "llama-3.1-8b",
        ["--data-parallel-size", "2"],
        {"served_data_parallel_size": 2, "data_parallel_size": 1},
    ),
    Deployment(
        # An MoE model's DP ranks stay coordinated: the scheduler sees DP 2.
        "data-parallel-2-moe",
        "qwen3-30b-a3b",
        ["--data-parallel-size", "2"],
        {"served_data_parallel_size": 2, "data_parallel_size": 2},
    ),
    Deployment(
        "pipeline-parallel-2",
        "llama-3.1-8b",
        ["--pipeline-parallel-size", "2"],
        {"pipeline_parallel_size": 2, "workers": 2},
        # Synchronous PP: the first stage gets each step's sampled tokens.
        exercises_when_sync=("new_token_ids_to_first_stage",),
    ),
    Deployment(
        # N-gram speculation: the drafts come from the runner, no drafter
        # model, so no lookahead slots.
        "ngram-speculation",
        "llama-3.1-8b",
        ["--speculative-config", SPEC_NGRAM],
        {"num_speculative_tokens": 3},
        exercises=("spec_drafts",),
    ),
    Deployment(
        # N-gram speculation beside pipeline parallelism (two stages).
        "pipeline-parallel-2-ngram",
        "llama-3.1-8b",
        ["--pipeline-parallel-size", "2", "--speculative-config", SPEC_NGRAM],
        {"pipeline_parallel_size": 2, "workers": 2, "num_speculative_tokens": 3},
        exercises=("spec_drafts",),
    ),
    Deployment(
        # Dynamic speculation lengths: 3 drafts for batches of up to 2, 1
        # beyond (vLLM's ranges).
        "ngram-dynamic-speculation",
        "llama-3.1-8b",
        [
            "--speculative-config",
            json.dumps(
                json.loads(SPEC_NGRAM)
                | {"num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 256, 1]]}
            ),
        ],
        {"num_speculative_tokens": 3},
        exercises=("spec_drafts",),
    ),
    Deployment(
        "eagle3-speculation",
        "llama-3.1-8b",
        ["--speculative-config", SPEC_EAGLE3],
        {"num_speculative_tokens": 3, "num_lookahead_tokens": 3},
        exercises=("spec_drafts",),
    ),
    Deployment(
        # DFlash: a block drafter over the target's hidden states (k + 1
        # lookahead slots, no hash lookahead, no block drop).
        "qwen3-8b-dflash",
        "qwen3-8b",
        [
            "--speculative-config",
            json.dumps(
                {
                    "method": "dflash",
                    "model": "{models}/qwen3-8b-dflash",
                    "num_speculative_tokens": 7,
                }
            ),
        ],
        {"num_speculative_tokens": 7, "num_lookahead_tokens": 8, "num_hash_lookahead_tokens": 0},
        exercises=("spec_drafts",),
    ),
    Deployment(
        # DSpark: a block drafter that samples its first draft from the
        # anchor (k lookahead slots, no hash lookahead, no block drop);
        # vLLM runs it on model runner V2 only, a GPU host's.
        "qwen3-8b-dspark",
        "qwen3-8b",
        [
            "--speculative-config",
            json.dumps({"method": "dspark", "model": "{models}/qwen3-8b-dspark"}),
        ],
        {"num_speculative_tokens": 7, "num_lookahead_tokens": 7, "num_hash_lookahead_tokens": 0},
        exercises=("spec_drafts",),
        flavors=("gpu-defaults",),
    ),
    Deployment(
        # Suffix decoding at its defaults (24 drafts at most, no drafter
        # model): vLLM runs it on model runner V1 without async scheduling,
        # on a GPU host too, which is what this host resolves.
        "llama-3.1-8b-suffix-decoding",
        "llama-3.1-8b",
        ["--speculative-config", json.dumps({"method": "suffix"})],
        {"num_speculative_tokens": 24, "num_lookahead_tokens": 0, "async_scheduling": False},
        exercises=("spec_drafts",),
        flavors=("cpu-host",),
    ),
    Deployment(
        # A proposer class of the user's (vLLM imports it in the workers):
        # model runner V1, no async scheduling, as for suffix decoding.
        "llama-3.1-8b-custom-proposer",
        "llama-3.1-8b",
        [
            "--speculative-config",
            json.dumps(
                {
                    "method": "custom_class",
                    "model": "my_proposers.Lookup",
                    "num_speculative_tokens": 4,
                }
            ),
        ],
        {"num_speculative_tokens": 4, "num_lookahead_tokens": 0, "async_scheduling": False},
        exercises=("spec_drafts",),
        flavors=("cpu-host",),
    ),
    Deployment(
        # An FP8 KV cache with its first layer kept in BF16: one group of
        # two precisions, which vLLM's scheduler is not told to zero.
        "llama-3.1-8b-fp8-kv-skip-layer",
        "llama-3.1-8b",
        ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "0"],
        {"kv_groups": ["FullAttentionSpec"], "needs_kv_cache_zeroing": False},
    ),
    Deployment(
        # EAGLE-3 with lookahead block hashes off: each prefix hit gives up
        # its last block instead.
        "eagle3-last-block-drop",
        "llama-3.1-8b",
        [
            "--speculative-config",
            json.dumps({**json.loads(SPEC_EAGLE3), "disable_lookahead_block_hashes": True}),
        ],
        {"num_speculative_tokens": 3, "num_hash_lookahead_tokens": 0},
        exercises=("spec_drafts",),
    ),
    Deployment(
        "deepseek-v3-mtp",
        "deepseek-v3",
        ["--speculative-config", SPEC_MTP],
        {"use_mla": True, "num_speculative_tokens": 1, "num_lookahead_tokens": 1},
        exercises=("spec_drafts",),
    ),
    Deployment(
        # Three MTP modules, three drafts: each prefill chunk leaves the
        # modules their three-token read-ahead.
        "deepseek-v3-mtp3",
        "deepseek-v3-mtp3",
        ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 3})],
        {"use_mla": True, "num_speculative_tokens": 3, "num_lookahead_tokens": 3},
        exercises=("spec_drafts",),
    ),
    Deployment(
        # One adapter a batch: a second adapter's request waits while the
        # first's later one overtakes it.
        "lora-max-loras-1",
        "llama-3.1-8b",
        ["--enable-lora", "--max-loras", "1", "--max-lora-rank", "8"],
        {"max_loras": 1},
        exercises=("lora_requests", "lora_overtaken"),
    ),
    Deployment(
        # A vision model served for text: images and videos turned off, so
        # no request carries an encoder input and vLLM schedules it as text.
        "qwen2.5-vl-7b-images-off",
        "qwen2.5-vl-7b",
        ["--limit-mm-per-prompt", json.dumps({"image": 0, "video": 0})],
        {"is_multimodal_model": True, "supports_multimodal_inputs": False},
    ),
    Deployment(
        # Gemma 3 with images off: six KV-cache groups, scheduled as text.
        "gemma-3-12b-vision-images-off",
        "gemma-3-12b-vision",
        ["--limit-mm-per-prompt", json.dumps({"image": 0})],
        {
            "is_multimodal_model": True,
            "supports_multimodal_inputs": False,
            "kv_groups": ["SlidingWindowSpec"] * 5 + ["FullAttentionSpec"],
        },
    ),
    Deployment(
        # Images on: vLLM's encoder budget and cache from the model's image
        # processor; two requests share an image, one straddles a chunk.
        "qwen2.5-vl-7b-images",
        "qwen2.5-vl-7b",
        ["--max-num-batched-tokens", "128"],
        {"is_multimodal_model": True, "supports_multimodal_inputs": True},
        exercises=("image_requests", "encoder_inputs"),
    ),
    Deployment(
        # Gemma 3 with images: six KV-cache groups (five sliding windows)
        # and vLLM's encoder budget from its image processor.
        "gemma-3-12b-vision-images",
        "gemma-3-12b-vision",
        ["--max-num-batched-tokens", "128"],
        {
            "is_multimodal_model": True,
            "supports_multimodal_inputs": True,
            "kv_groups": ["SlidingWindowSpec"] * 5 + ["FullAttentionSpec"],
        },
        exercises=("image_requests", "encoder_inputs"),
    ),
    Deployment(
        # A vision model behind NIXL (disaggregated prefill of image
        # prompts): images scheduled beside the connector's hits.
        "qwen2.5-vl-7b-images-nixl",
        "qwen2.5-vl-7b",
        ["--max-num-batched-tokens", "128", "--kv-transfer-config", kv_connector("NixlConnector")],
        {
            "supports_multimodal_inputs": True,
            "kv_connector": "NixlPullConnector",
        },
        exercises=("image_requests", "encoder_inputs", "connector_metadata"),
    ),
    Deployment(
        # ... and Gemma 3's, its five window groups kept beside NIXL.
        "gemma-3-12b-vision-images-nixl",
        "gemma-3-12b-vision",
        ["--max-num-batched-tokens", "128", "--kv-transfer-config", kv_connector("NixlConnector")],
        {
            "supports_multimodal_inputs": True,
            "kv_connector": "NixlPullConnector",
            "kv_groups": ["SlidingWindowSpec"] * 5 + ["FullAttentionSpec"],
        },
        exercises=("image_requests", "encoder_inputs", "connector_metadata"),
    ),
    Deployment(
        # Llama 4 with images: chunked local attention in three groups of
        # four, and vLLM's encoder budget from its image processor (2,448
        # embeddings an image: 17 tiles of 144).
        "llama-4-scout-vision-images",
        "llama-4-scout-vision",
        ["--max-num-batched-tokens", "128"],
        {
            "is_multimodal_model": True,
            "supports_multimodal_inputs": True,
            "kv_groups": ["ChunkedLocalAttentionSpec"] * 3 + ["FullAttentionSpec"],
        },
        exercises=("image_requests", "encoder_inputs"),
    ),
    Deployment(
        # Whisper: an encoder-decoder (its decoder's KV cache and a
        # cross-attention group over the audio's 1,500 frames), vLLM's
        # encoder budget from its feature extractor, one clip a step; no
        # chunked prefill, no prefix caching (vLLM turns both off).
        "whisper-large-v3",
        "whisper-large-v3",
        [],
        {
            "is_encoder_decoder": True,
            "enable_prefix_caching": False,
            "enable_chunked_prefill": False,
            "kv_groups": ["FullAttentionSpec", "CrossAttentionSpec"],
        },
        exercises=("image_requests", "encoder_inputs", "encoder_freed"),
    ),
    Deployment(
        # Whisper with KV-cache events (prefix caching is off: nothing is
        # stored) and residency metrics over both groups' blocks.
        "whisper-large-v3-events-metrics",
        "whisper-large-v3",
        ["--kv-events-config", KV_EVENTS, "--kv-cache-metrics"],
        {"is_encoder_decoder": True, "kv_events": True, "kv_cache_metrics": True},
        exercises=("encoder_inputs",),
    ),
    Deployment(
        # Whisper with an fp8 KV cache that layer 0 skips: its decoder and
        # cross-attention groups fit 16 tokens in a page, the other layers'
        # 32 (docs/scheduling.md §7.16), each group its own block math.
        "whisper-large-v3-fp8-skip-layer-0",
        "whisper-large-v3",
        ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "0"],
        {"is_encoder_decoder": True, "needs_kv_cache_zeroing": True},
        exercises=("encoder_inputs",),
    ),
    Deployment(
        # Prompts may come as embeddings: the option alone changes nothing
        # in how token prompts are scheduled.
        "prompt-embeds",
        "llama-3.1-8b",
        ["--enable-prompt-embeds"],
        {},
    ),
    Deployment(
        # An embedding model (Qwen3-Embedding-8B is Qwen3-8B's shape, served
        # with --runner pooling): prompts only, each finished by its pooled
        # result; a long prompt in chunks, a prefix hit, an abort.
        "qwen3-embedding-8b",
        "qwen3-8b",
        ["--runner", "pooling", "--max-num-batched-tokens", "64"],
        {"runner_type": "pooling"},
        exercises=("pooled_outputs",),
    ),
    Deployment(
        # An embedding model with encoder-only attention (BERT): no KV cache
        # at all (vLLM's one block, no group), no chunked prefill, no prefix
        # caching; each prompt whole in one step, finished by its result.
        "bge-base-en-v1.5",
        "bge-base-en-v1.5",
        ["--max-num-batched-tokens", "512"],
        {
            "runner_type": "pooling",
            "kv_groups": [],
            "num_blocks": 1,
            "enable_prefix_caching": False,
            "enable_chunked_prefill": False,
        },
        exercises=("pooled_outputs",),
    ),
    Deployment(
        # The producer of disaggregated encoding: Qwen2.5-VL's vision tower
        # alone (--mm-encoder-only), no language model and so no KV cache;
        # each request ends once its prompt's images are encoded.
        "qwen2.5-vl-7b-encoder-only",
        "qwen2.5-vl-7b",
        ["--mm-encoder-only", "--max-num-batched-tokens", "128"],
        {
            "supports_multimodal_inputs": True,
            "kv_groups": [],
            "num_blocks": 1,
            "enable_prefix_caching": False,
        },
        exercises=("image_requests", "encoder_inputs"),
    ),
    # Encoder-cache connectors (docs/scheduling.md §4.20): disaggregated
    # encoding's producer (the vision tower alone) and its consumer, vLLM's
    # example connector behind the drop-in.
    Deployment(
        "qwen2.5-vl-7b-encoder-only-ec-producer",
        "qwen2.5-vl-7b",
        ["--mm-encoder-only", "--max-num-batched-tokens", "128"]
        + ["--ec-transfer-config", ec_connector("ec_producer")],
        {"supports_multimodal_inputs": True, "kv_groups": [], "ec_connector": "ECExampleConnector"},
        exercises=("image_requests", "encoder_inputs", "ec_metadata"),
    ),
    Deployment(
        "qwen2.5-vl-7b-ec-consumer",
        "qwen2.5-vl-7b",
        ["--max-num-batched-tokens", "128", "--ec-transfer-config", ec_connector("ec_consumer")],
        {"supports_multimodal_inputs": True, "ec_connector": "ECExampleConnector"},
        exercises=("image_requests", "encoder_inputs", "ec_metadata"),
    ),
    Deployment(
        # Encode, prefill and decode apart: the prefill instance takes its
        # images' encodings from the encoder's (an encoder-cache consumer)
        # and hands its KV to the decode instance (a NIXL producer). Errors
        # and finished transfers settle in one update, in vLLM's order.
        "qwen2.5-vl-7b-ec-consumer-nixl-prefill",
        "qwen2.5-vl-7b",
        ["--max-num-batched-tokens", "128", "--ec-transfer-config", ec_connector("ec_consumer")]
        + ["--kv-transfer-config", kv_connector("NixlConnector", "kv_producer")],
        {
            "supports_multimodal_inputs": True,
            "ec_connector": "ECExampleConnector",
            "kv_connector": "NixlPullConnector",
        },
        exercises=("image_requests", "encoder_inputs", "ec_metadata", "connector_metadata"),
    ),
    Deployment(
        "qwen2.5-vl-7b-language-model-only",
        "qwen2.5-vl-7b",
        ["--language-model-only"],
        {"is_multimodal_model": True, "supports_multimodal_inputs": False},
    ),
    # KV connectors (docs/scheduling.md §4.19): vLLM's own connector object,
    # built by its factory, behind the drop-in. The workload carries no
    # transfer parameters: each connector is asked, told and shown every
    # request as vLLM's scheduler would (test_vllm_pd_pair.py hands
    # requests over between a prefill and a decode instance).
    Deployment(
        "nixl-kv-both",
        "llama-3.1-8b",
        ["--kv-transfer-config", kv_connector("NixlConnector")],
        {"kv_connector": "NixlPullConnector"},
        exercises=("connector_metadata",),
    ),
    Deployment(
        "nixl-prefill-instance",
        "llama-3.1-8b",
        ["--kv-transfer-config", kv_connector("NixlConnector", "kv_producer")],
        {"kv_connector": "NixlPullConnector"},
        exercises=("connector_metadata",),
    ),
    Deployment(
        "nixl-decode-instance",
        "llama-3.1-8b",
        ["--kv-transfer-config", kv_connector("NixlConnector", "kv_consumer")],
        {"kv_connector": "NixlPullConnector"},
        exercises=("connector_metadata",),
    ),
    Deployment(
        # A hybrid model behind NIXL (it supports vLLM's hybrid manager):
        # the window groups stay beside full attention, and a finished
        # request's blocks of every group go to the connector.
        "gpt-oss-20b-nixl-kv-both",
        "gpt-oss-20b",
        ["--kv-transfer-config", kv_connector("NixlConnector")],
        {
            "kv_connector": "NixlPullConnector",
            "kv_groups": ["SlidingWindowSpec", "FullAttentionSpec"],
        },
        exercises=("connector_metadata",),
    ),
    Deployment(
        "example-connector",
        "llama-3.1-8b",
        [
            "--kv-transfer-config",
            kv_connector("ExampleConnector", shared_storage_path=EXAMPLE_STORE),
        ],
        {"kv_connector": "ExampleConnector"},
        exercises=("connector_metadata",),
    ),
    Deployment(
        "multi-connector-nixl-example",
        "llama-3.1-8b",
        [
            "--kv-transfer-config",
            json.dumps(
                {
                    "kv_connector": "MultiConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {
                        "connectors": [
                            json.loads(kv_connector("NixlConnector")),
                            json.loads(
                                kv_connector("ExampleConnector", shared_storage_path=EXAMPLE_STORE)
                            ),
                        ]
                    },
                }
            ),
        ],
        {"kv_connector": "MultiConnector"},
        exercises=("connector_metadata",),
    ),
    Deployment(
        # CPU offloading (--kv-offloading-size, GiB): vLLM's OffloadingConnector.
        "cpu-offloading",
        "llama-3.1-8b",
        ["--kv-offloading-size", "1"],
        {"kv_connector": "OffloadingConnector"},
        # Full blocks stored to CPU memory as they fill, each job reported
        # done by the stand-in workers.
        exercises=("connector_metadata", "offload_stores"),
    ),
    Deployment(
        # CPU offloading of a hybrid model: the offloading connector stores
        # every group's blocks (it supports vLLM's hybrid manager).
        "gpt-oss-20b-cpu-offloading",
        "gpt-oss-20b",
        ["--kv-offloading-size", "1"],
        {
            "kv_connector": "OffloadingConnector",
            "kv_groups": ["SlidingWindowSpec", "FullAttentionSpec"],
        },
        exercises=("connector_metadata",),
    ),
    Deployment(
        # vLLM's observability options, passed through: a step's FLOPs and
        # bytes in the stats, the encoder inputs a step runs (none here), each
        # request's acceptance histogram on its last output.
        "observability-options",
        "llama-3.1-8b",
        ["--enable-mfu-metrics", "--enable-logging-iteration-details"]
        + ["--speculative-config", SPEC_NGRAM, "--per-request-spec-decode-metrics", "detailed"],
        {
            "enable_mfu_metrics": True,
            "iteration_details": True,
            "per_request_spec_decode_metrics": "detailed",
            "num_speculative_tokens": 3,
        },
        exercises=("spec_drafts", "perf_stats", "spec_decode_metrics"),
    ),
    Deployment(
        # Priority scheduling: a request of higher priority (a lower value)
        # goes first and preempts the lowest-priority running one.
        "priority-policy",
        "qwen3-30b-a3b",
        ["--scheduling-policy", "priority"],
        {"policy": "priority", "is_moe": True},
    ),
    Deployment(
        "scheduler-options",
        "llama-3.1-8b",
        ["--prefill-schedule-interval", "4", "--watermark", "0.05"]
        + ["--max-num-scheduled-tokens", "64"],
        {"prefill_schedule_interval": 4, "watermark": 0.05, "max_num_scheduled_tokens": 64},
        exercises=("steps_at_token_cap",),
    ),
    Deployment(
        # Linear attention beside full attention, prefix caching off: vLLM's
        # Mamba cache mode "none", a state block of the model's length.
        "qwen3-next-80b-a3b-no-prefix-caching",
        "qwen3-next-80b-a3b",
        ["--no-enable-prefix-caching"],
        {"enable_prefix_caching": False, "kv_groups": ["MambaSpec"] * 3 + ["FullAttentionSpec"]},
    ),
    Deployment(
        # Qwen3-Next's own MTP layer drafting: a scratch state per draft in
        # each linear-attention group.
        "qwen3-next-80b-a3b-mtp-no-prefix-caching",
        "qwen3-next-80b-a3b",
        ["--no-enable-prefix-caching", "--speculative-config", SPEC_QWEN3_NEXT_MTP],
        {"enable_prefix_caching": False, "num_speculative_tokens": 2},
        exercises=("spec_drafts",),
    ),
    Deployment(
        "nemotron-h-8b-no-prefix-caching",
        "nemotron-h-8b",
        ["--no-enable-prefix-caching"],
        {"enable_prefix_caching": False},
    ),
    Deployment(
        "jamba-v0.1-no-prefix-caching",
        "jamba-v0.1",
        ["--no-enable-prefix-caching", "--max-model-len", "32768"],
        {"enable_prefix_caching": False},
    ),
    Deployment(
        "granite-4.0-h-small-no-prefix-caching",
        "granite-4.0-h-small",
        ["--no-enable-prefix-caching", "--max-model-len", "32768"],
        {"enable_prefix_caching": False},
    ),
    Deployment(
        # vLLM's default for a hybrid: prefix caching on, Mamba cache mode
        # "align" (states of the block size, cached at block boundaries).
        "qwen3-next-80b-a3b",
        "qwen3-next-80b-a3b",
        [],
        {"enable_prefix_caching": True, "kv_groups": ["MambaSpec"] * 3 + ["FullAttentionSpec"]},
    ),
    Deployment(
        # ... with its MTP drafter: hashes one token ahead, a scratch state
        # per draft.
        "qwen3-next-80b-a3b-mtp",
        "qwen3-next-80b-a3b",
        ["--speculative-config", SPEC_QWEN3_NEXT_MTP],
        {"enable_prefix_caching": True, "num_speculative_tokens": 2},
        exercises=("spec_drafts",),
    ),
    Deployment(
        # ... with three MTP drafts: its linear-attention states outgrow
        # the attention page, and vLLM grows the attention blocks to 1,072
        # tokens beside states of 16 (hashes of 16, hits on 1,072:
        # docs/scheduling.md §7.16).
        "qwen3-next-80b-a3b-mtp-3",
        "qwen3-next-80b-a3b",
        ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 3})],
        {
            "enable_prefix_caching": True,
            "num_speculative_tokens": 3,
            "group_block_sizes": [16, 16, 16, 1072],
        },
        exercises=("spec_drafts",),
    ),
    # Mamba2 layers write the prompt's checkpoint from inside its last
    # chunk (vLLM's prefill checkpoint blocks).
    Deployment("nemotron-h-8b", "nemotron-h-8b", [], {"enable_prefix_caching": True}),
    Deployment(
        "jamba-v0.1",
        "jamba-v0.1",
        ["--max-model-len", "32768"],
        {"enable_prefix_caching": True},
    ),
    Deployment(
        "granite-4.0-h-small",
        "granite-4.0-h-small",
        ["--max-model-len", "32768"],
        {"enable_prefix_caching": True},
    ),
    Deployment(
        # KV-aware routing (llm-d) of Qwen3-Next with three MTP drafts: KV
        # events beside attention blocks grown to 1,072 tokens (§7.16).
        "qwen3-next-80b-a3b-mtp-3-kv-events",
        "qwen3-next-80b-a3b",
        ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 3})]
        + ["--kv-events-config", KV_EVENTS],
        {"kv_events": True, "group_block_sizes": [16, 16, 16, 1072]},
    ),
    Deployment(
        # Disaggregated prefill of gpt-oss with its windows kept unquantized
        # (groups of different block sizes beside a KV connector, §7.16).
        "gpt-oss-20b-fp8-skip-windows-nixl",
        "gpt-oss-20b",
        ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "sliding_window"]
        + ["--kv-transfer-config", kv_connector("NixlConnector")],
        {"kv_connector": "NixlPullConnector", "group_block_sizes": [32, 64]},
    ),
    Deployment(
        # Routed experts returned with each output (RL rollouts replaying
        # the router; vLLM builds it on model runner V2 only): each step
        # names the block hashes the workers keep them by, and the finished
        # requests' blocks retained and released (vLLM's auxiliary-output
        # connector, on the drop-in's replayed cache).
        "qwen3-30b-a3b-routed-experts",
        "qwen3-30b-a3b",
        ["--enable-return-routed-experts"],
        {"aux_outputs": True, "is_moe": True},
        flavors=("gpu-defaults",),
        exercises=("routed_experts", "aux_block_hashes", "aux_retained"),
    ),
    Deployment(
        # Routed experts beside CPU offloading: an external hit is kept only
        # where the workers hold its blocks' routing, and they retain twice
        # the blocks (docs/scheduling.md §7.12).
        "qwen3-30b-a3b-routed-experts-cpu-offloading",
        "qwen3-30b-a3b",
        ["--enable-return-routed-experts", "--kv-offloading-size", "1"],
        {"aux_outputs": True, "is_moe": True, "kv_connector": "OffloadingConnector"},
        flavors=("gpu-defaults",),
        exercises=("routed_experts", "aux_block_hashes", "connector_metadata"),
    ),
    Deployment(
        # Disaggregated prefill of a linear-attention hybrid over NIXL with
        # prefix caching off (a decode pool's usual setting; vLLM's cache
        # mode "none"): a state block per group loaded beside attention's.
        "qwen3-next-80b-a3b-nixl-no-prefix-caching",
        "qwen3-next-80b-a3b",
        ["--kv-transfer-config", kv_connector("NixlConnector"), "--no-enable-prefix-caching"],
        {"kv_connector": "NixlPullConnector", "enable_prefix_caching": False},
        exercises=("connector_metadata",),
    ),
    Deployment(
        # CPU offloading of a Mamba2 hybrid, its states cached (prefix
        # caching on): each cached state is offered with its block, and the
        # connector stores those its window takes.
        "nemotron-h-8b-cpu-offloading",
        "nemotron-h-8b",
        ["--kv-offloading-size", "1"],
        {"kv_connector": "OffloadingConnector"},
        exercises=("offload_stores",),
    ),
    Deployment(
        # Disaggregated prefill of a linear-attention hybrid over NIXL, its
        # states cached (prefix caching on: vLLM's cache mode "align"):
        # NIXL completes divergent hybrid hits, so it is told full
        # attention's own hit while a state's lags.
        "qwen3-next-80b-a3b-nixl",
        "qwen3-next-80b-a3b",
        ["--kv-transfer-config", kv_connector("NixlConnector")],
        {"kv_connector": "NixlPullConnector", "enable_prefix_caching": True},
        exercises=("connector_metadata",),
    ),
    # Deployments vLLM 0.33 serves that the drop-in hands to vLLM's own
    # scheduler would follow here, listed in NOT_YET: none are left.
]
# Rows the drop-in does not take yet, and the reason it logs. Their
# engagement test xfails once the row is built and falls back, and fails
# when the row starts to engage; remove a row from here to make its
# fallback a failure.
NOT_YET: dict[str, str] = {}
# Rows whose workload finds no prefix hit with prefix caching on, in vLLM
# as in the drop-in, and why.
NO_PREFIX_HITS: dict[str, str] = {
    # A hit needs a cached state at a block boundary the prompts share, and
    # with MTP's lookahead hashes vLLM caches none in this workload.
    "qwen3-next-80b-a3b-mtp": "no state cached where the prompts meet",
    # Hits land on 1,072-token attention blocks; the prompts are shorter.
    "qwen3-next-80b-a3b-mtp-3": "the prompts are under one scheduler block",
    # The prompts share 48 tokens, one of gpt-oss's 32-token blocks, which
    # EAGLE's last-block drop gives up.
    "gpt-oss-20b-eagle3-block-drop": "the one shared block is the one dropped",
    "gpt-oss-20b-eagle3-nixl": "the one shared block is the one dropped",
    # The prompts share 48 tokens, under one 64-token scheduler block: hits
    # land on its multiples.
    "gpt-oss-20b-fp8-skip-windows": "the shared prefix is under one scheduler block",
    "gpt-oss-20b-fp8-skip-windows-eagle3": "the shared prefix is under one scheduler block",
    "gpt-oss-20b-fp8-skip-windows-kv-events": "the shared prefix is under one scheduler block",
    "gpt-oss-20b-fp8-skip-windows-nixl": "the shared prefix is under one scheduler block",
    "gpt-oss-20b-fp8-skip-windows-eagle3-block-drop": (
        "the shared prefix is under one scheduler block"
    ),
    "gpt-oss-20b-fp8-skip-windows-eagle3-nixl": "the shared prefix is under one scheduler block",
    "qwen3-next-80b-a3b-mtp-3-kv-events": "the prompts are under one scheduler block",
}
# What every engaged row's workload must go through (deployment_setup.workload),
# prefix hits wherever prefix caching is on (the CPU platform turns it off
# for MLA models).
ALWAYS_EXERCISED = ("prompt_logprobs_outputs", "masked_rows", "finished_length")
# A pooling model's requests carry none of those: they finish with their
# pooled result ("stop").
POOLING_EXERCISED = ("finished_stop",)


def _key(row: Deployment, flavor: str) -> str:
    """The row's entry in the report (as deployment_setup.py names it)."""
    return f"{row.id}[{flavor}]"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every row in every flavour, built and run once, in one child process."""
    rows = [{**row._asdict(), "flavor": f} for row in TABLE for f in row.flavors]
    return build_rows(rows, tmp_path_factory.mktemp("deployments"), timeout=600)


def build_rows(rows: list[dict[str, Any]], tmp: Path, timeout: int) -> dict[str, Any]:
    """``deployment_setup.py`` on ``rows`` in a child process; its report."""
    (tmp / "rows.json").write_text(json.dumps(rows))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_USE_V2_MODEL_RUNNER"}
    env |= {
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    done = subprocess.run(
        [sys.executable, str(HERE / "deployment_setup.py"), str(tmp / "rows.json")]
        + [str(tmp / "report.json")],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0 or not (tmp / "report.json").exists():
        pytest.fail(f"deployment_setup.py failed ({done.returncode}):\n{done.stderr[-6000:]}")
    return json.loads((tmp / "report.json").read_text())


def _row(report: dict[str, Any], row: Deployment, flavor: str) -> dict[str, Any]:
    built = report[_key(row, flavor)]
    assert "error" not in built, built.get("error")
    return built


def _params(rows: list[Deployment]) -> list[Any]:
    return [pytest.param(row, f, id=f"{row.id}-{f}") for row in rows for f in row.flavors]


@pytest.mark.parametrize(("row", "flavor"), _params(TABLE))
def test_each_row_builds_the_deployment_it_names(
    report: dict[str, Any], row: Deployment, flavor: str
) -> None:
    """The command line took effect (the reasoning parser, the MLA cache,
    the parallelism, the options are there), and vLLM's own engine and the
    one with the drop-in were built alike but for the scheduler: the same
    KV-cache groups, block count, budgets and options. Without this, an
    engaging drop-in could be an engine other than the one the row names."""
    built = _row(report, row, flavor)
    theirs, ours = built["vllm"], built["drop_in"]
    for name, value in {**row.expect, **FLAVORS[flavor]}.items():
        assert ours[name] == value, (name, ours[name])
    assert theirs["scheduler"].startswith("vllm.v1.core.sched."), theirs["scheduler"]
    same = {k: v for k, v in theirs.items() if k != "scheduler"}
    assert {k: v for k, v in ours.items() if k != "scheduler"} == same


@pytest.mark.parametrize(("row", "flavor"), _params(TABLE))
def test_drop_in_engages(report: dict[str, Any], row: Deployment, flavor: str) -> None:
    """EngineCore resolved ``--scheduler-cls ironbatch.vllm.Scheduler`` and
    constructed the drop-in itself, which took the configuration: no "does
    not support" line on the ``ironbatch.vllm`` logger, and the scheduler
    EngineCore holds is ``ironbatch.vllm.Scheduler``, not the vLLM scheduler
    the drop-in hands an unsupported configuration to."""
    built = _row(report, row, flavor)
    fallbacks = [line for line in built["warnings"] if "does not support" in line]
    if row.id in NOT_YET:  # built, and known to fall back: news once it engages
        assert fallbacks, f"{row.id} engages now: take it out of NOT_YET"
        pytest.xfail(f"falls back: {NOT_YET[row.id]}")
    assert not fallbacks, fallbacks
    assert built["drop_in"]["scheduler"] == DROP_IN
    assert built["engaged"]


def check_falls_back_for_the_known_reason(
    report: dict[str, Any], row: Deployment, flavor: str
) -> None:
    """A row in NOT_YET falls back for the reason recorded there, in the one
    line the drop-in logs, to the vLLM scheduler that fits the engine; a
    different reason is news."""
    built = _row(report, row, flavor)
    fallbacks = [line for line in built["warnings"] if "does not support" in line]
    assert len(fallbacks) == 1 and NOT_YET[row.id] in fallbacks[0], fallbacks
    expected = "AsyncScheduler" if FLAVORS[flavor]["async_scheduling"] else "Scheduler"
    assert fallbacks[0].endswith(f"uses vLLM's {expected}"), fallbacks
    assert built["drop_in"]["scheduler"] == built["vllm"]["scheduler"]


if NOT_YET:  # (none now: a test only while a row falls back)
    test_rows_not_taken_yet_fall_back_for_the_known_reason = pytest.mark.parametrize(
        ("row", "flavor"), _params([row for row in TABLE if row.id in NOT_YET])
    )(check_falls_back_for_the_known_reason)


@pytest.mark.parametrize(("row", "flavor"), _params(TABLE))
def test_drop_in_runs_like_vllm(report: dict[str, Any], row: Deployment, flavor: str) -> None:
    """The same workload through both engines in lockstep: plain requests,
    one hitting the other's cached prefix, prompt logprobs, a structured-output
    request (its grammar resolved by a stand-in backend), a resumable
    streaming-input session (three input chunks, one queued while a turn
    runs, then the end of its input), an abort. Every SchedulerOutput
    the workers got, every grammar bitmask, every EngineCoreOutputs, every
    KV-cache event and each structured request's reasoning state must be
    equal, step by step."""
    built = _row(report, row, flavor)
    if not built["engaged"]:
        pytest.skip("vLLM's own scheduler on both sides (see test_drop_in_engages)")
    parity = built["parity"]
    assert parity["mismatch"] is None, parity["mismatch"]
    seen = parity["exercised"]
    pooling = row.expect.get("runner_type") == "pooling"
    # An encoder-only deployment samples nothing either.
    encoder_only = row.expect.get("kv_groups") == [] and not pooling
    musts = (POOLING_EXERCISED if pooling or encoder_only else ALWAYS_EXERCISED) + row.exercises
    if built["drop_in"]["enable_prefix_caching"] and row.id not in NO_PREFIX_HITS:
        musts += ("prefix_hits",)
    if not FLAVORS[flavor]["async_scheduling"]:
        musts += row.exercises_when_sync
    for what in musts:
        assert seen.get(what, 0) > 0, (what, seen)
    if pooling:
        assert seen["finished_stop"] == 5, seen  # every request but the aborted one
    elif encoder_only:
        assert seen["finished_stop"] == 4, seen  # every request but the aborted one
    elif row.expect.get("is_encoder_decoder"):
        assert seen["finished_length"] == 5, seen  # every transcription but the aborted one
    else:
        assert seen["finished_length"] >= 7, seen  # four requests, three turns of the session
