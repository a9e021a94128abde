"""Deployments built the way ``vllm serve`` builds them, on the CPU, each run
through vLLM's own ``EngineCore`` twice: once as vLLM resolves it by default,
once with ``--scheduler-cls ironbatch.vllm.Scheduler``.

This module is the child-process half of ``test_vllm_deployments.py``:
``python deployment_setup.py ROWS.json REPORT.json`` builds every row of
ROWS.json and writes what it found to REPORT.json. It runs in a process of
its own because what it needs is process-wide in vLLM and would leak into
the other drop-in tests: the platform (``VLLM_TARGET_DEVICE=cpu``, without
which ``create_engine_config`` cannot pick a device here, is read once, when
vLLM first asks for its platform), the torch.distributed groups that building
a model's layers needs, and EngineCore's environment-variable cache.

Per row:

* a folder with a ``config.json`` shaped like the real model's (same
  architecture, layer count, heads, head sizes, MoE and MLA settings; no
  weights) and a small local tokenizer (so the structured-output manager
  loads it and resolves the reasoning parser, as a served model's would);
* ``vllm serve``'s own argument parser and ``AsyncEngineArgs`` turn the row's
  flags into a VllmConfig (``UsageContext.OPENAI_API_SERVER``);
* the model's KV-cache specs come from vLLM's model class, built on the meta
  device, asked the way vLLM's model runner asks its attention layers;
* an executor that stands in for the workers reports those specs (split by
  pipeline stage) and enough memory for a ``max_model_len`` sequence, so
  EngineCore sizes the cache, resolves the scheduler class and constructs it
  itself;
* the same small workload (plain requests, a shared prefix, prompt
  logprobs, a structured-output request, a resumable streaming-input session,
  an abort) goes through both engines in lockstep, and every SchedulerOutput,
  grammar bitmask, EngineCoreOutputs and KV-cache event must be equal;
* for ``test_vllm_families.py``, a row may ask for random workloads after
  it (``"random": {"seed", "count"}``), each compared the same way, and
  for the drop-in broken one way while it runs (``"mutation"``, a key of
  ``MUTATIONS``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import json
import logging
import os
import random
import sys
import time
import traceback
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, ClassVar
from unittest import mock

assert os.environ.get("VLLM_TARGET_DEVICE") == "cpu", "run by test_vllm_deployments.py"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import vllm.envs  # noqa: E402
import vllm.v1.engine.core as engine_core_module  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from vllm.config import VllmConfig, get_layers_from_vllm_config, set_current_vllm_config  # noqa: E402
from vllm.distributed import parallel_state  # noqa: E402
from vllm.distributed.aux_output_connector.connector import AuxRequestOutput  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends  # noqa: E402
from vllm.distributed.utils import get_pp_indices  # noqa: E402
from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: E402
from vllm.entrypoints.common.cli_args import make_arg_parser  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase  # noqa: E402
from vllm.model_executor.model_loader.utils import get_model_architecture  # noqa: E402
from vllm.model_executor.models.utils import extract_layer_index  # noqa: E402
from vllm.multimodal.inputs import (  # noqa: E402
    MultiModalFeatureSpec,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from vllm.pooling_params import PoolingParams  # noqa: E402
from vllm.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402
from vllm.usage.usage_lib import UsageContext  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts  # noqa: E402
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput  # noqa: E402
from vllm.v1.engine import EngineCoreRequest  # noqa: E402
from vllm.v1.engine.core import EngineCore  # noqa: E402
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig, KVCacheSpec  # noqa: E402
from vllm.v1.outputs import (  # noqa: E402
    EMPTY_MODEL_RUNNER_OUTPUT,
    DraftTokenIds,
    LogprobsTensors,
    ModelRunnerOutput,
)  # noqa: E402
from vllm.v1.structured_output.backend_types import StructuredOutputGrammar  # noqa: E402
from vllm.v1.worker.utils import customize_attention_spec  # noqa: E402

import ironbatch._core  # noqa: E402
import ironbatch.vllm  # noqa: E402
import ironbatch.vllm.settings  # noqa: E402
import ironbatch.vllm.speculation  # noqa: E402
from ironbatch.bench.vllm_driver import offload_jobs_done  # noqa: E402
from ironbatch.config import CacheConfig, KVCacheGroup, SchedulerConfig  # noqa: E402
from ironbatch.vllm.harness import suffix_decoding_allowed  # noqa: E402

import fake_grammar  # noqa: E402
from deployment_models import MODELS  # noqa: E402
from stand_in_executor import StandInExecutor  # noqa: E402
from vllm_pair import engine_outputs_view, plain, scheduler_output_view  # noqa: E402

DROP_IN = "ironbatch.vllm.Scheduler"

# -- the tokenizer every model folder gets -----------------------------------------

EOS = 2
THINK_START, THINK_END = 3, 4  # what Qwen3's reasoning parser looks for
_SPECIAL = ["<unk>", "<|endoftext|>", "<|im_end|>", "<think>", "</think>"]
_VOCAB = {t: i for i, t in enumerate(_SPECIAL)} | {f"w{i}": i for i in range(len(_SPECIAL), 512)}


# Gemma 3's image tokens and the newline runs its processor looks up, as
# named tokenizer attributes (boi_token, ...) where they have a name.
_GEMMA3_IMAGE_TOKENS = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}
_GEMMA3_NEWLINES = ["\n" * k for k in range(1, 5)]
# The tokens a model's image processor looks up, by model type.
_IMAGE_TOKENS = {
    "gemma3": [*_GEMMA3_IMAGE_TOKENS.values(), *_GEMMA3_NEWLINES],
    "llama4": [
        "<|image_start|>",
        "<|image_end|>",
        "<|image|>",
        "<|patch|>",
        "<|tile_x_separator|>",
        "<|tile_y_separator|>",
    ],
}


def write_tokenizer(path: str, model_type: str = "") -> None:
    """A word-level tokenizer with Qwen3's reasoning markers: enough for
    vLLM to load one and for its reasoning parsers to find their tokens;
    for Gemma 3 and Llama 4 with their image tokens after the words."""
    extra = _IMAGE_TOKENS.get(model_type, [])
    vocab = _VOCAB | {t: len(_VOCAB) + i for i, t in enumerate(extra)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(path, "tokenizer.json"))
    specials = [(i, t) for i, t in enumerate(_SPECIAL)]
    specials += [(vocab[t], t) for t in extra]
    added = {
        str(i): {
            "content": t,
            "special": t not in ("<think>", "</think>"),
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
        for i, t in specials
    }
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": _SPECIAL[EOS],
        "unk_token": "<unk>",
        "added_tokens_decoder": added,
    }
    if model_type == "gemma3":  # its processor reads them as named attributes
        config["extra_special_tokens"] = _GEMMA3_IMAGE_TOKENS
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


# Qwen2-VL's image processor settings (the real model's): what vLLM's
# MultiModalBudget reads to size the encoder's budget and cache.
_QWEN2_VL_IMAGE_PROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}


# Gemma 3's (SigLIP's) image processor settings, the real model's.
_GEMMA3_IMAGE_PROCESSOR = {
    "image_processor_type": "Gemma3ImageProcessor",
    "processor_class": "Gemma3Processor",
    "do_pan_and_scan": None,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "resample": 2,
    "rescale_factor": 1 / 255,
    "size": {"height": 896, "width": 896},
    "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_crop_size": 256,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}


# Llama 4's image processor and processor settings, the real model's.
_LLAMA4_IMAGE_PROCESSOR = {
    "image_processor_type": "Llama4ImageProcessorFast",
    "processor_class": "Llama4Processor",
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "do_convert_rgb": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_patches": 16,
    "resize_to_max_canvas": False,
    "size": {"height": 336, "width": 336},
    "rescale_factor": 1 / 255,
    "resample": 2,
}
# Whisper's feature extractor settings (large-v3's): 30-second windows of
# 128 mel bins, which its encoder turns into 1,500 frames.
_WHISPER_FEATURE_EXTRACTOR = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "processor_class": "WhisperProcessor",
    "chunk_length": 30,
    "feature_size": 128,
    "hop_length": 160,
    "n_fft": 400,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": False,
    "sampling_rate": 16000,
}
_IMAGE_PROCESSORS = {
    "qwen2_5_vl": _QWEN2_VL_IMAGE_PROCESSOR,
    "gemma3": _GEMMA3_IMAGE_PROCESSOR,
    "llama4": _LLAMA4_IMAGE_PROCESSOR,
    "whisper": _WHISPER_FEATURE_EXTRACTOR,
}
_PROCESSORS = {
    "gemma3": {"processor_class": "Gemma3Processor", "image_seq_length": 256},
    "llama4": {
        "processor_class": "Llama4Processor",
        "fake_image_token": "<|image|>",
        "image_token": "<|image|>",
        "patch_size": 14,
        "pixel_shuffle_ratio": 0.5,
    },
}


def write_model(root: str, name: str) -> str:
    """The folder ``vllm serve`` is pointed at for ``name`` (a Qwen2.5-VL's
    with its image processor's settings too)."""
    path = os.path.join(root, name)
    # Written every time (a few small files): a folder left in the scratch
    # directory by an earlier run must not keep an older config.
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(MODELS[name], f)
    kind = MODELS[name]["model_type"]
    write_tokenizer(path, kind)
    if kind in _IMAGE_PROCESSORS:
        with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
            json.dump(_IMAGE_PROCESSORS[kind], f)
    if kind in _PROCESSORS:
        with open(os.path.join(path, "processor_config.json"), "w") as f:
            json.dump(_PROCESSORS[kind], f)
    return path


# -- configuration, as `vllm serve` makes it ------------------------------------------


def engine_config(model_dir: str, flags: list[str], scheduler_cls: str | None) -> VllmConfig:
    """``vllm serve MODEL_DIR FLAGS [--scheduler-cls ...]``: its parser, its
    engine arguments, its usage context. A flag may name another model's
    folder as ``{models}/NAME`` (a drafter's, say)."""
    root = os.path.dirname(model_dir)
    for name in MODELS:
        if any(f"{{models}}/{name}" in flag for flag in flags):
            write_model(root, name)
    flags = [flag.replace("{models}", root) for flag in flags]
    argv = ["--model", model_dir, *flags]
    if scheduler_cls is not None:
        argv += ["--scheduler-cls", scheduler_cls]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    # Suffix decoding's trees (the arctic-inference package) run in the
    # workers, which these engines stand in for.
    with suffix_decoding_allowed(True):
        return engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


# What a CUDA host resolves differently from this CPU host for the same
# command line: the CPU platform turns async scheduling off, and without
# Triton vLLM falls back to model runner V1; on a GPU both defaults stand.
GPU_DEFAULTS_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "1"}


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set for the block, the process's own values back after."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def with_gpu_defaults(vc: VllmConfig) -> None:
    """Async scheduling back on, as on a CUDA host (where nothing in these
    command lines turns it off); the V2 runner comes from GPU_DEFAULTS_ENV.
    An MLA model also gets back what only the CPU platform takes from it:
    prefix caching, chunked prefill, and a token budget of `vllm serve`'s
    default on a large GPU instead of a whole max_model_len."""
    vc.scheduler_config.async_scheduling = True
    if vc.model_config.use_mla:
        vc.cache_config.enable_prefix_caching = True
        vc.scheduler_config.enable_chunked_prefill = True
        vc.scheduler_config.max_num_batched_tokens = 8192


def as_engine_process(vc: VllmConfig) -> None:
    """What vLLM's engine-core process does to its config before it builds
    EngineCore: a data-parallel rank of a dense model is an independent
    engine (DP size 1); a rank of an MoE model stays in its DP group (rank 0
    here; the DP group itself, and the DP engine's prefill throttling that
    goes with it, need the other ranks and are not built)."""
    pc = vc.parallel_config
    if pc.data_parallel_size > 1:
        if vc.model_config.is_moe:
            pc.data_parallel_rank = 0
            pc.data_parallel_rank_local = 0
        else:
            pc.reconfigure_for_independent_dp_rank()


# -- KV-cache specs, as the workers would report them ---------------------------------

_dist_started = False


def _model_parallel_groups(vc: VllmConfig, root: str) -> None:
    """One-process tensor/pipeline/expert groups for building ``vc``'s
    layers (the expert group exists only when made under an MoE config)."""
    global _dist_started
    if not _dist_started:
        init_file = os.path.join(root, "torch-distributed-init")
        parallel_state.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"file://{init_file}",  # no port is bound
            backend="gloo",
        )
        _dist_started = True
    else:
        parallel_state.destroy_model_parallel()
    parallel_state.ensure_model_parallel_initialized(1, 1)


# The flags that change a layer's KV-cache spec: prefix caching decides a
# recurrent (Mamba) layer's cache mode and state block size, and the drafts
# its scratch states.
SPEC_FLAGS = ("--no-enable-prefix-caching",)
SPEC_FLAGS_WITH_VALUE = ("--speculative-config", "--kv-cache-dtype", "--kv-cache-dtype-skip-layers")


def specs_key(row: dict[str, Any]) -> tuple[str, tuple[str, ...], bool]:
    """The layers a row runs on: its model's, under its spec flags, on a
    GPU host's runner where the row runs there only."""
    return row["model"], spec_flags(row["flags"]), row["flavors"] == ["gpu-defaults"]


def spec_flags(flags: list[str]) -> tuple[str, ...]:
    """The row's flags that its model's layer specs are built under."""
    out: list[str] = []
    for i, flag in enumerate(flags):
        if flag in SPEC_FLAGS:
            out.append(flag)
        elif flag in SPEC_FLAGS_WITH_VALUE:
            out += flags[i : i + 2]
    return tuple(out)


class ModelSpecs:
    """One model's attention layers, built once on the meta device under its
    `vllm serve` config with ``flags`` (SPEC_FLAGS): their KV-cache specs
    and the KV layouts their backends support (what a worker's model runner
    reports). No other flag of the table changes a layer's KV cache, so every
    row of a model with those flags shares them; pipeline stages split them
    by layer."""

    def __init__(self, model_dir: str, flags: tuple[str, ...] = (), gpu_only: bool = False) -> None:
        # A row that vLLM builds on a GPU host's runner only (DSpark's
        # drafter) builds its layers there too.
        with environment(GPU_DEFAULTS_ENV if gpu_only else {}):
            vc = engine_config(model_dir, list(flags), None)
        with set_current_vllm_config(vc):
            _model_parallel_groups(vc, os.path.dirname(model_dir))
            model_cls, _ = get_model_architecture(vc.model_config)
            with torch.device("meta"):
                model_cls(vllm_config=vc, prefix="")
            layers = get_layers_from_vllm_config(vc, AttentionLayerBase)  # type: ignore[type-abstract]
            self.specs: dict[str, KVCacheSpec] = {}
            for name, layer in layers.items():
                if getattr(layer, "kv_sharing_target_layer_name", None):
                    continue  # reads another layer's cache: no cache of its own
                spec = layer.get_kv_cache_spec(vc)
                if spec is None:
                    continue
                if isinstance(spec, AttentionSpec):
                    # The backend may adjust the spec (kernel block sizes).
                    spec = customize_attention_spec(layer.get_attn_backend(), spec)
                self.specs[name] = spec
            backends = get_current_attn_backends(vc)
            self.layouts = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
        self.num_layers = vc.model_config.hf_text_config.num_hidden_layers

    def by_stage(self, pp_size: int) -> list[dict[str, KVCacheSpec]]:
        """The specs each pipeline stage's worker reports (its own layers)."""
        stages: list[dict[str, KVCacheSpec]] = []
        for rank in range(pp_size):
            start, end = get_pp_indices(self.num_layers, rank, pp_size)
            stages.append(
                {n: s for n, s in self.specs.items() if start <= extract_layer_index(n) < end}
            )
        return stages


# -- the workers: no model, deterministic tokens ------------------------------------------


def token_for(request_id: str, position: int) -> int:
    """The token ``request_id`` samples at ``position``: fixed, so both
    engines see the same. Never EOS or the fake grammars' rejected token;
    structured-output requests sometimes end their reasoning."""
    v = (sum(map(ord, request_id)) * 31 + position * 17) % 97
    if request_id.startswith("json") and v % 4 == 0:
        return THINK_END
    token = 5 + v
    return token + 1 if token == fake_grammar.REJECTED else token


class Sampler:
    """What the model runner samples at each step, decided once (on vLLM's
    engine: a request samples when its scheduled tokens reach the end of
    its known tokens) and replayed on the drop-in's engine in the same
    order: both get identical model-runner outputs for identical steps."""

    def __init__(self) -> None:
        self.decisions: deque[tuple[list[str], ModelRunnerOutput]] = deque()


class _DoneFuture(Future):
    def __init__(self, value: Any) -> None:
        super().__init__()
        self.set_result(value)


class DeploymentExecutor(StandInExecutor):
    """Stands in for the row's workers (one per pipeline stage): reports
    their KV-cache specs, layouts and memory; "runs" each step by handing
    back the step's sampled tokens (and prompt logprobs)."""

    worker_specs: ClassVar[list[dict[str, KVCacheSpec]]]
    layouts: ClassVar[list[str]]
    memory: ClassVar[int]
    sampler: ClassVar[Sampler]
    leads: ClassVar[bool]  # decides the tokens (vLLM's engine) or replays them

    def _init_executor(self) -> None:
        self.scheduler: Any = None  # set once EngineCore has built it
        self.received: list[dict[str, Any]] = []
        self.grammar: list[Any] = []
        self.kv_cache_configs: list[KVCacheConfig] = []
        self.pending: ModelRunnerOutput | None = None
        # Speculative decoding: the requests of the last step, whose drafts
        # the proposer hands over next (the same on both engines: a
        # function of the step number and the id).
        self.num_steps = 0
        self.last_step_ids: list[str] = []
        self.prompt_logprobs_sent: set[str] = set()

    def get_kv_cache_specs(self) -> list[dict[str, KVCacheSpec]]:
        return copy.deepcopy(self.worker_specs)

    @property
    def supported_tasks(self) -> tuple[str, ...]:
        """What the workers' model serves (EngineCore checks a pooling
        request's task against it)."""
        pooling = self.vllm_config.model_config.runner_type == "pooling"
        return ("embed",) if pooling else ("generate",)

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        return [list(self.layouts) for _ in self.worker_specs]

    def determine_available_memory(self) -> list[int]:
        return [self.memory for _ in self.worker_specs]

    def initialize_from_config(self, kv_cache_configs: list[KVCacheConfig]) -> None:
        self.kv_cache_configs = kv_cache_configs

    def get_kv_connector_handshake_metadata(self) -> list[Any]:
        """No worker registered KV caches with a transfer agent: nothing for
        a connector's handshake (so NIXL binds no side channel: two engines
        in one process would want the same port)."""
        return []

    def execute_model(  # type: ignore[override]
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> Any:
        # A copy: a scheduler may reuse what it handed out in a later step.
        self.received.append(copy.deepcopy(scheduler_output_view(scheduler_output)))
        ids = list(scheduler_output.num_scheduled_tokens)
        transfers = offload_jobs_done(scheduler_output.kv_connector_metadata)
        if not ids:
            output = EMPTY_MODEL_RUNNER_OUTPUT  # nothing ran: the output now
            if transfers is not None:  # but a connector's transfers did
                output = copy.copy(output)
                output.kv_connector_output = transfers
            return _DoneFuture(output) if non_block else output
        self.num_steps += 1
        self.last_step_ids = ids
        if self.leads:
            self.pending = self._decide(scheduler_output)
            self.sampler.decisions.append((ids, copy.deepcopy(self.pending)))
        else:
            decided_ids, self.pending = (
                self.sampler.decisions.popleft() if self.sampler.decisions else ([], None)
            )
            if decided_ids != ids:  # the schedules differ: the comparison says how
                self.pending = ModelRunnerOutput(
                    req_ids=ids,
                    req_id_to_index={r: i for i, r in enumerate(ids)},
                    sampled_token_ids=[[] for _ in ids],
                )
        if self.pending is not None and transfers is not None:
            self.pending.kv_connector_output = transfers
        if self.vllm_config.model_config.runner_type == "pooling" or self.encoder_only:
            # A pooling runner, or the encoder alone, samples nothing: the
            # output comes at once (EngineCore calls no sample_tokens()).
            output, self.pending = self.pending, None
            return _DoneFuture(output) if non_block else output
        # Like the GPU model runner: the output comes with sample_tokens().
        return _DoneFuture(None) if non_block else None

    def sample_tokens(  # type: ignore[override]
        self, grammar_output: GrammarOutput | None, non_block: bool = False
    ) -> Any:
        if grammar_output is None:
            self.grammar.append(None)
        else:
            self.grammar.append(
                (
                    list(grammar_output.structured_output_request_ids),
                    grammar_output.grammar_bitmask.tolist(),
                )
            )
        output, self.pending = self.pending, None
        assert output is not None, "sample_tokens without execute_model"
        return _DoneFuture(output) if non_block else output

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The proposer's drafts for the last step's requests: up to k
        tokens each, some none."""
        k = self.vllm_config.num_speculative_tokens
        if not k:
            return None
        drafts = []
        for rid in self.last_step_ids:
            n = zlib.crc32(f"{rid}/{self.num_steps}".encode()) % (k + 1)
            drafts.append([token_for(rid, self.num_steps * 31 + i) for i in range(n)])
        return DraftTokenIds(req_ids=list(self.last_step_ids), draft_token_ids=drafts)

    @property
    def encoder_only(self) -> bool:
        """The instance runs the multimodal encoder alone (--mm-encoder-only)."""
        return bool(self.vllm_config.is_mm_encoder_only)

    def _decide(self, so: SchedulerOutput) -> ModelRunnerOutput:
        ids = list(so.num_scheduled_tokens)
        assert self.scheduler is not None
        if self.encoder_only:
            # No token, no pooled result: the scheduler ends a request once
            # its prompt is consumed (vLLM's empty encoder output).
            return ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[[] for _ in ids],
                pooler_output=[None for _ in ids],
            )
        if self.vllm_config.model_config.runner_type == "pooling":
            # A pooling runner: an embedding for each prompt the step
            # finished (a function of the id), nothing for a chunk.
            return ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[],
                pooler_output=[
                    None
                    if self.scheduler.requests[rid].is_prefill_chunk
                    else torch.full((4,), float(zlib.crc32(rid.encode()) % 1000))
                    for rid in ids
                ],
            )
        sampled: list[list[int]] = []
        prompt_logprobs: dict[str, LogprobsTensors | None] = {}
        for rid in ids:
            r = self.scheduler.requests[rid]
            if r.is_prefill_chunk:
                sampled.append([])
            else:
                # The verification keeps some drafts (never a placeholder
                # that pads a synchronous step) and samples one more token.
                drafts = so.scheduled_spec_decode_tokens.get(rid, [])
                kept = 0 if -1 in drafts else r.num_computed_tokens % (len(drafts) + 1)
                start = r.num_computed_tokens - len(drafts)
                sampled.append([token_for(rid, start + i) for i in range(kept + 1)])
            start = r.num_computed_tokens - so.num_scheduled_tokens[rid]
            if (
                r.sampling_params.prompt_logprobs
                and start < r.num_prompt_tokens <= r.num_computed_tokens
                and rid not in self.prompt_logprobs_sent
            ):
                # The runner hands the prompt's logprobs over whole, with the
                # chunk that completes the prompt: one row per prompt token
                # after the first; once (a preempted request recomputes its
                # prompt with its output, in chunks that sample nothing).
                self.prompt_logprobs_sent.add(rid)
                positions = torch.arange(1, r.num_prompt_tokens)
                prompt_logprobs[rid] = LogprobsTensors(
                    logprob_token_ids=torch.stack([positions % 97 + 5, positions % 89 + 5], 1),
                    logprobs=-(positions.float()[:, None] / 10 + torch.tensor([0.0, 1.0])),
                    selected_token_ranks=positions % 3 + 1,
                )
        output = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
            prompt_logprobs_dict=prompt_logprobs,
        )
        if self.vllm_config.aux_output_config.enabled:
            output.aux_output_connector_output = self._routed_experts(ids, so)
        return output

    def _routed_experts(self, ids: list[str], so: SchedulerOutput) -> dict[str, Any]:
        """Each request's routed experts (--enable-return-routed-experts):
        from its first token past what the step computes, each row a
        function of the request and the position."""
        k = self.vllm_config.num_speculative_tokens
        assert self.scheduler is not None
        rows = {}
        for rid in ids:
            r = self.scheduler.requests[rid]
            positions = np.arange(max(r.num_computed_tokens, r.num_tokens) + k + 2)
            experts = np.stack([positions % 8, (positions + zlib.crc32(rid.encode())) % 8], 1)
            rows[rid] = AuxRequestOutput(token_start=0, rows=experts)
        return rows


def executor_class(
    worker_specs: list[dict[str, KVCacheSpec]],
    layouts: list[str],
    memory: int,
    sampler: Sampler,
    leads: bool,
) -> type[DeploymentExecutor]:
    attrs = {
        "worker_specs": worker_specs,
        "layouts": layouts,
        "memory": memory,
        "sampler": sampler,
        "leads": leads,
    }
    return type("DeploymentExecutor", (DeploymentExecutor,), attrs)


def memory_for(specs: dict[str, KVCacheSpec], max_model_len: int) -> int:
    """Bytes a worker reports free for its KV cache: room for one
    ``max_model_len`` sequence in every layer, and some spare blocks. Beside
    recurrent (Mamba) layers vLLM pads every layer's page to the largest,
    so each block is counted at that size."""
    pages = [spec.page_size_bytes for spec in specs.values()]
    hybrid = any(type(spec).__name__ == "MambaSpec" for spec in specs.values())
    total = 0
    for spec in specs.values():
        blocks = -(-max_model_len // spec.block_size) + 64
        total += blocks * (max(pages) if hybrid else spec.page_size_bytes)
    return total


# -- grammars and events, the same on both sides -----------------------------------------


class Grammar(fake_grammar.FakeGrammar, StructuredOutputGrammar):
    """The fake grammar, as a grammar type vLLM's manager recognises (it
    checks the type where a reasoning parser is in play)."""


class CompilingBackend(fake_grammar.FakeBackend):
    """The grammar backend a structured-output request resolves to, with the
    fake grammars (no tokenizer vocabulary to compile against)."""

    def compile_grammar(self, request_type: Any, grammar_spec: str, **kwargs: Any) -> Any:
        del request_type, grammar_spec, kwargs
        return Grammar()

    def destroy(self) -> None:
        pass


class EventRecorder:
    """A KV-event publisher that keeps each batch's events."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def publish(self, batch: Any) -> None:
        self.batches.append(list(batch.events))

    def shutdown(self) -> None:
        pass

    def get_publisher_config(self) -> None:
        return None


class WarningLog(logging.Handler):
    """What the drop-in logs at WARNING and above."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


# -- the workload -------------------------------------------------------------------------


def _prompt(seed: int, n: int) -> list[int]:
    return [5 + (seed * 7919 + i * 104729) % 400 for i in range(n)]


def _request(
    rid: str, prompt: list[int], max_tokens: int, arrival: float, **kw: Any
) -> EngineCoreRequest:
    """An EngineCoreRequest as vLLM's input processor hands it to the engine."""
    resumable = kw.pop("resumable", False)
    priority = kw.pop("priority", 0)
    cache_salt = kw.pop("cache_salt", None)
    # Prompt embeddings: alone (no token ids), or mixed with the ids.
    embeds = kw.pop("prompt_embeds", None)
    is_token_ids = kw.pop("prompt_is_token_ids", None)
    lora_request = kw.pop("lora_request", None)
    mm = [_image(*m) for m in kw.pop("mm", ())] + [_audio(*a) for a in kw.pop("audio", ())]
    sp = SamplingParams(max_tokens=max_tokens, **kw)
    if sp.structured_outputs is not None:
        sp.structured_outputs._backend = "xgrammar"  # what the processor resolves "auto" to
    sp.update_from_generation_config({}, EOS)
    return EngineCoreRequest(
        request_id=rid,
        prompt_token_ids=None if embeds is not None and is_token_ids is None else prompt,
        mm_features=mm or None,
        sampling_params=sp,
        pooling_params=None,
        arrival_time=arrival,
        lora_request=lora_request,
        cache_salt=cache_salt,
        data_parallel_rank=None,
        prompt_embeds=embeds,
        prompt_is_token_ids=is_token_ids,
        resumable=resumable,
        priority=priority,
    )


def _image(identifier: str, offset: int, length: int) -> MultiModalFeatureSpec:
    """An image as vLLM's input processor hands it over (its tensors left
    out: nothing here runs the vision tower)."""
    return MultiModalFeatureSpec(
        data=MultiModalKwargsItem.dummy(),
        modality="image",
        identifier=identifier,
        mm_position=PlaceholderRange(offset=offset, length=length),
    )


def _audio(identifier: str, length: int) -> MultiModalFeatureSpec:
    """An encoder-decoder's audio as vLLM's input processor hands it over:
    the encoder's ``length`` frames at position 0, apart from the decoder's
    prompt (its tensors left out)."""
    return MultiModalFeatureSpec(
        data=MultiModalKwargsItem.dummy(),
        modality="audio",
        identifier=identifier,
        mm_position=PlaceholderRange(offset=0, length=length),
    )


# Whisper's decoder prompt: start of transcript, language, task, no timestamps.
_TRANSCRIBE = [50258, 50259, 50360, 50364]
_FRAMES = 1500  # Whisper's encoder output for a 30-second window


def audio_workload() -> dict[int, list[tuple[str, Any]]]:
    """Transcriptions by tick (an encoder-decoder model): more audio than
    one step's encoder budget takes (each clip waits its turn), prompt
    logprobs, a structured-output request, a request without audio, an
    abort. No streaming session: vLLM's input processor takes none for an
    encoder-decoder model."""
    json_schema = StructuredOutputsParams(json={"type": "object"})
    clip = [("clip-a", _FRAMES)]
    return {
        0: [
            ("add", _request("transcribe-0", _TRANSCRIBE, 12, 0.0, audio=clip)),
            (
                "add",
                _request(
                    "logprobs-1",
                    _TRANSCRIBE,
                    4,
                    0.0,
                    audio=[("clip-b", _FRAMES)],
                    prompt_logprobs=2,
                ),
            ),
            (
                "add",
                _request(
                    "json-2",
                    _TRANSCRIBE,
                    12,
                    0.0,
                    audio=[("clip-c", _FRAMES)],
                    structured_outputs=json_schema,
                ),
            ),
        ],
        # The same clip again: an encoder-decoder shares no encoder output.
        2: [("add", _request("again-3", _TRANSCRIBE, 30, 2.0, audio=clip))],
        3: [("add", _request("aborted-4", _TRANSCRIBE, 40, 3.0, audio=[("clip-d", _FRAMES)]))],
        5: [("abort", "aborted-4"), ("add", _request("text-5", _TRANSCRIBE + [400], 6, 5.0))],
    }


def _pooling_request(rid: str, prompt: list[int], arrival: float) -> EngineCoreRequest:
    """An embedding request as vLLM's input processor hands it over."""
    return EngineCoreRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        mm_features=None,
        sampling_params=None,
        pooling_params=PoolingParams(task="embed"),
        arrival_time=arrival,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )


def pooling_workload() -> dict[int, list[tuple[str, Any]]]:
    """Embedding requests by tick: a long one that takes several chunks,
    short ones beside it, one that hits another's cached prefix, an abort
    (of a request queued behind a long one, so that an engine that takes
    whole prompts, as one without a KV cache does, has not finished it)."""
    shared = _prompt(1, 48)
    return {
        0: [
            ("add", _pooling_request("embed-0", shared + _prompt(2, 10), 0.0)),
            ("add", _pooling_request("long-1", _prompt(3, 300), 0.0)),
            ("add", _pooling_request("embed-2", _prompt(4, 21), 0.0)),
        ],
        3: [("add", _pooling_request("prefix-4", shared + _prompt(6, 5), 3.0))],
        4: [
            ("add", _pooling_request("long-6", _prompt(8, 400), 4.0)),
            ("add", _pooling_request("aborted-5", _prompt(7, 200), 4.0)),
        ],
        5: [("abort", "aborted-5")],
    }


def encoder_only_workload() -> dict[int, list[tuple[str, Any]]]:
    """Requests by tick for the encoder alone (--mm-encoder-only): an image
    that straddles a chunk boundary, the same image again (a cache hit), a
    prompt without images, an abort; each ends once its prompt is consumed.
    No streaming session: vLLM's front end takes none for such an instance."""
    return {
        0: [
            ("add", _request("image-0", _prompt(14, 300), 4, 0.0, mm=[("cat", 100, 64)])),
            ("add", _request("image-1", _prompt(15, 80), 4, 0.0, mm=[("dog", 4, 64)])),
        ],
        2: [
            ("add", _request("again-2", _prompt(16, 90), 4, 2.0, mm=[("cat", 10, 64)])),
            ("add", _request("text-3", _prompt(17, 40), 4, 2.0)),
        ],
        3: [("add", _request("aborted-4", _prompt(18, 300), 4, 3.0, mm=[("bird", 200, 64)]))],
        4: [("abort", "aborted-4")],
    }


def workload(lora: bool = False, images: bool = False) -> dict[int, list[tuple[str, Any]]]:
    """Arrivals and aborts by tick; with LoRA on, three requests under two
    adapters as well (at --max-loras 1, the second adapter's waits while the
    first adapter's later request overtakes it); with images, three requests
    with images, one of them shared, one straddling a chunk boundary."""
    shared = _prompt(1, 48)
    json_schema = StructuredOutputsParams(json={"type": "object"})
    plan = {
        0: [
            ("add", _request("plain-0", shared + _prompt(2, 10), 12, 0.0)),
            ("add", _request("logprobs-1", _prompt(3, 37), 4, 0.0, prompt_logprobs=2)),
            ("add", _request("json-2", _prompt(4, 21), 12, 0.0, structured_outputs=json_schema)),
            ("add", _request("stream-3", _prompt(5, 19), 3, 0.0, resumable=True)),
        ],
        # The session's second input chunk, queued while its first turn runs.
        1: [("add", _request("stream-3", _prompt(8, 6), 3, 1.0, resumable=True))],
        # Arrives once plain-0's prefix is cached.
        4: [("add", _request("prefix-4", shared + _prompt(6, 5), 8, 4.0, stop_token_ids=[40]))],
        5: [("add", _request("aborted-5", _prompt(7, 30), 40, 5.0))],
        # The third chunk, to a session waiting for input; then the end of its
        # input (a chunk that is not resumable ends the session).
        9: [
            ("abort", "aborted-5"),
            ("add", _request("stream-3", _prompt(9, 4), 2, 9.0, resumable=True)),
        ],
        16: [("add", _request("stream-3", _prompt(10, 3), 2, 16.0))],
    }
    if lora:
        adapter = {i: LoRARequest(f"adapter-{i}", i, f"/adapters/{i}") for i in (1, 2)}
        plan[2] = [
            ("add", _request("lora-6", _prompt(11, 20), 10, 2.0, lora_request=adapter[1])),
            ("add", _request("lora-7", _prompt(12, 20), 4, 2.0, lora_request=adapter[2])),
        ]
        plan[3] = [("add", _request("lora-8", _prompt(13, 9), 4, 3.0, lora_request=adapter[1]))]
    if images:
        plan[2] = [
            ("add", _request("image-6", _prompt(14, 300), 6, 2.0, mm=[("cat", 10, 256)])),
            ("add", _request("image-7", _prompt(15, 80), 6, 2.0, mm=[("dog", 4, 64)])),
        ]
        plan[6] = [("add", _request("image-8", _prompt(16, 300), 4, 6.0, mm=[("cat", 30, 256)]))]
    return plan


# -- one row ------------------------------------------------------------------------------


class Engine:
    """One EngineCore for the row, and what it produced."""

    def __init__(
        self, vc: VllmConfig, exec_cls: type[DeploymentExecutor], warnings: WarningLog
    ) -> None:
        self.engine = EngineCore(vc, executor_class=exec_cls, log_stats=True)
        self.scheduler = self.engine.scheduler
        self.executor: DeploymentExecutor = self.engine.model_executor  # type: ignore[assignment]
        self.executor.scheduler = self.scheduler
        self.warnings = list(warnings.lines)
        self.publisher = type(getattr(self.scheduler, "kv_event_publisher", None)).__name__
        som = self.engine.structured_output_manager
        som.backend = CompilingBackend()
        som.backend_name = "xgrammar"
        som._use_async_grammar_compilation = False  # compile at once: both sides alike
        self.events = EventRecorder()
        self.scheduler.kv_event_publisher = self.events
        # Residency metrics sample blocks at random: here every third block
        # handed out, the same ones in both engines when both hand out alike.
        metrics = getattr(self.scheduler, "_kv_metrics", None)
        collector = getattr(metrics, "collector", None) or getattr(
            self.scheduler, "kv_metrics_collector", None
        )
        if collector is not None:
            calls = itertools.count()
            collector.should_sample_block = lambda: next(calls) % 3 == 0
        self.steps: list[Any] = []

    def apply(self, action: str, arg: Any) -> None:
        if action == "add":
            self.engine.add_request(*self.engine.preprocess_add_request(copy.deepcopy(arg)))
        else:
            self.engine.abort_requests([arg])

    def busy(self) -> bool:
        return self.scheduler.has_requests() or bool(self.engine.batch_queue)

    def step(self) -> None:
        outputs, executed = self.engine.step_fn()
        self.engine.post_step(executed)
        view = None if outputs is None else plain(engine_outputs_view(outputs))
        # Where each structured-output request's reasoning stands (the
        # drop-in keeps it current on vLLM's Request: the grammar needs it).
        reasoning = [
            (rid, r.structured_output_request.reasoning_ended)
            for rid, r in self.scheduler.requests.items()
            if r.use_structured_output
        ]
        self.steps.append((executed, view, self.events.batches[:], reasoning))
        self.events.batches.clear()

    def facts(self) -> dict[str, Any]:
        vc = self.engine.vllm_config
        sc, pc, mc, so = (
            vc.scheduler_config,
            vc.parallel_config,
            vc.model_config,
            vc.structured_outputs_config,
        )
        kvc = self.scheduler.kv_cache_config
        som = self.engine.structured_output_manager
        return {
            "scheduler": f"{type(self.scheduler).__module__}.{type(self.scheduler).__qualname__}",
            "kv_groups": [type(g.kv_cache_spec).__name__ for g in kvc.kv_cache_groups],
            "group_block_sizes": [g.kv_cache_spec.block_size for g in kvc.kv_cache_groups],
            "num_blocks": kvc.num_blocks,
            "needs_kv_cache_zeroing": bool(kvc.needs_kv_cache_zeroing),
            "block_size": vc.cache_config.block_size,
            "max_model_len": mc.max_model_len,
            "workers": len(self.executor.worker_specs),
            "is_moe": bool(mc.is_moe),
            "use_mla": bool(mc.use_mla),
            "reasoning_parser": so.reasoning_parser,
            "reasoner_cls": None if som.reasoner_cls is None else som.reasoner_cls.__name__,
            "structured_outputs_backend": so.backend,
            "kv_events": bool(vc.kv_events_config and vc.kv_events_config.enable_kv_cache_events),
            "kv_cache_metrics": bool(vc.observability_config.kv_cache_metrics),
            "kv_event_publisher": self.publisher,
            "pipeline_parallel_size": pc.pipeline_parallel_size,
            "data_parallel_size": pc.data_parallel_size,
            "tensor_parallel_size": pc.tensor_parallel_size,
            "decode_context_parallel_size": pc.decode_context_parallel_size,
            "prefill_context_parallel_size": pc.prefill_context_parallel_size,
            "batch_queue_size": self.engine.batch_queue_size,
            "async_scheduling": bool(sc.async_scheduling),
            "use_v2_model_runner": bool(vc.use_v2_model_runner),
            "policy": sc.policy,
            "aux_outputs": bool(vc.aux_output_config.enabled),
            "max_num_seqs": sc.max_num_seqs,
            "max_num_batched_tokens": sc.max_num_batched_tokens,
            "max_num_scheduled_tokens": sc.max_num_scheduled_tokens,
            "watermark": sc.watermark,
            "prefill_schedule_interval": sc.prefill_schedule_interval,
            "enable_prefix_caching": bool(vc.cache_config.enable_prefix_caching),
            "enable_chunked_prefill": bool(sc.enable_chunked_prefill),
            "num_speculative_tokens": vc.num_speculative_tokens,
            "num_lookahead_tokens": vc.num_lookahead_tokens,
            "num_hash_lookahead_tokens": vc.num_hash_lookahead_tokens,
            "num_prefill_lookahead_tokens": vc.num_prefill_lookahead_tokens,
            "max_loras": None if vc.lora_config is None else vc.lora_config.max_loras,
            "is_multimodal_model": bool(mc.is_multimodal_model),
            "supports_multimodal_inputs": bool(mc.supports_multimodal_inputs),
            "is_encoder_decoder": bool(mc.is_encoder_decoder),
            "runner_type": mc.runner_type,
            "kv_connector": None
            if self.scheduler.get_kv_connector() is None
            else type(self.scheduler.get_kv_connector()).__name__,
            "ec_connector": None
            if self.scheduler.get_ec_connector() is None
            else type(self.scheduler.get_ec_connector()).__name__,
            "enable_mfu_metrics": bool(vc.observability_config.enable_mfu_metrics),
            "iteration_details": bool(vc.observability_config.enable_logging_iteration_details),
            "per_request_spec_decode_metrics": (
                vc.observability_config.per_request_spec_decode_metrics
            ),
        }

    def shutdown(self) -> None:
        self.engine.shutdown()
        # EngineCore freezes vLLM's environment variables once built; undo that.
        vllm.envs.disable_envs_cache()


def _first_difference(a: list[Any], b: list[Any], what: str) -> str | None:
    """Where two runs' records first differ: the record's index and, for a
    SchedulerOutput, only the fields that differ."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x == y:
            continue
        where = ""
        # Down to the first field that differs (dicts by key, sequences of
        # one length by index).
        while True:
            if isinstance(x, dict) and isinstance(y, dict) and x.keys() == y.keys():
                k = next(k for k in x if x[k] != y[k])
                where, x, y = f"{where}[{k!r}]", x[k], y[k]
            elif isinstance(x, list | tuple) and isinstance(y, list | tuple) and len(x) == len(y):
                j = next(j for j in range(len(x)) if x[j] != y[j])
                where, x, y = f"{where}[{j}]", x[j], y[j]
            else:
                break
        return f"{what} {i}{where} differs:\n vLLM:    {x!r:.1800}\n drop-in: {y!r:.1800}"
    if len(a) != len(b):
        return f"{what}: vLLM has {len(a)}, the drop-in {len(b)}"
    return None


def _exercised(e: Engine) -> dict[str, int]:
    """What the workload went through on vLLM's engine."""
    seen: Counter[str] = Counter()
    sc = e.engine.vllm_config.scheduler_config
    cap = sc.max_num_scheduled_tokens or sc.max_num_batched_tokens
    admitted: set[str] = set()
    for so in e.executor.received:
        # lora-8 arrives after lora-7: admitted first only past its skip.
        for d in so["scheduled_new_reqs"]:
            seen["lora_overtaken"] += d["req_id"] == "lora-8" and "lora-7" not in admitted
            seen["lora_requests"] += d["lora_request"] is not None
            seen["image_requests"] += bool(d["mm_features"])
            admitted.add(d["req_id"])
        seen["steps"] += 1
        seen["steps_at_token_cap"] += so["total_num_scheduled_tokens"] == cap
        seen["max_step_tokens"] = max(seen["max_step_tokens"], so["total_num_scheduled_tokens"])
        # The request built to share plain-0's prefix, admitted with blocks
        # already computed (a resumed session's computed tokens do not count).
        seen["prefix_hits"] += sum(
            1
            for d in so["scheduled_new_reqs"]
            if d["req_id"] == "prefix-4" and d["num_computed_tokens"] > 0
        )
        seen["sessions"] += sum(1 for d in so["scheduled_new_reqs"] if "-session" in d["req_id"])
        # Any request admitted with cached tokens (the random workloads').
        seen["local_hits"] += sum(1 for d in so["scheduled_new_reqs"] if d["num_computed_tokens"])
        seen["preempted"] += len(so["preempted_req_ids"] or ())
        meta = so["kv_connector_metadata"]  # (class name, fields) or None
        seen["connector_metadata"] += meta is not None
        if meta is not None and meta[0] == "OffloadingConnectorMetadata":
            seen["offload_stores"] += len(meta[1]["store_jobs"])
        seen["new_token_ids_to_first_stage"] += bool(so["scheduled_cached_reqs"]["new_token_ids"])
        seen["spec_drafts"] += sum(len(d) for d in so["scheduled_spec_decode_tokens"].values())
        seen["encoder_inputs"] += sum(map(len, so["scheduled_encoder_inputs"].values()))
        seen["encoder_freed"] += len(so["free_encoder_mm_hashes"])
        seen["ec_metadata"] += so.get("ec_connector_metadata") is not None
        aux = so.get("aux_output_connector_metadata")  # routed experts' block hashes
        seen["aux_block_hashes"] += aux is not None and bool(aux.block_hashes)
        seen["aux_retained"] += aux is not None and aux.retained_block_hashes is not None
    for g in e.executor.grammar:
        seen["masked_rows"] += 0 if g is None else len(g[0])
    for _, view, events, reasoning in e.steps:
        seen["kv_events"] += sum(len(batch) for batch in events)
        seen["reasoning_ended"] += sum(bool(ended) for _, ended in reasoning)
        seen["still_reasoning"] += sum(not ended for _, ended in reasoning)
        for eco in (view or {}).values():
            stats = eco["scheduler_stats"]
            seen["perf_stats"] += stats is not None and stats["perf_stats"] is not None
            for o in eco["outputs"]:
                seen["spec_decode_metrics"] += o["spec_decode_metrics"] is not None
                seen["prompt_logprobs_outputs"] += o["new_prompt_logprobs_tensors"] is not None
                seen["pooled_outputs"] += o["pooling_output"] is not None
                seen["routed_experts"] += o.get("routed_experts") is not None
                if o["finish_reason"] is not None:
                    seen[f"finished_{o['finish_reason']}"] += 1
    return dict(seen)


def run_row(
    row: dict[str, Any],
    root: str,
    specs_cache: dict[tuple[str, tuple[str, ...], bool], ModelSpecs],
) -> dict[str, Any]:
    """Build the row both ways and run the workload through both engines."""
    started = time.monotonic()
    model_dir = write_model(root, row["model"])
    model = specs_cache[specs_key(row)]
    log = WarningLog()
    logging.getLogger("ironbatch.vllm").addHandler(log)
    gpu_defaults = row["flavor"] == "gpu-defaults"
    with (
        environment(GPU_DEFAULTS_ENV if gpu_defaults else {}),
        MUTATIONS[row["mutation"]]() if row.get("mutation") else contextlib.nullcontext(),
    ):
        engines: list[Engine] = []
        try:
            sampler = Sampler()
            for leads, cls in ((True, None), (False, DROP_IN)):
                vc = engine_config(model_dir, row["flags"], cls)
                served_dp = vc.parallel_config.data_parallel_size
                if gpu_defaults:
                    with_gpu_defaults(vc)
                as_engine_process(vc)
                stages = model.by_stage(vc.parallel_config.pipeline_parallel_size)
                if vc.is_mm_encoder_only:
                    # The encoder's runner builds no language model: no KV cache.
                    stages = [{} for _ in stages]
                memory = max(memory_for(s, vc.model_config.max_model_len) for s in stages)
                exec_cls = executor_class(stages, model.layouts, memory, sampler, leads)
                log.lines.clear()
                engines.append(Engine(vc, exec_cls, log))
            theirs, ours = engines
            report: dict[str, Any] = {
                "vllm": theirs.facts() | {"served_data_parallel_size": served_dp},
                "drop_in": ours.facts() | {"served_data_parallel_size": served_dp},
                "warnings": ours.warnings,
                "engaged": type(ours.scheduler) is ironbatch.vllm.Scheduler,
            }
            if report["engaged"]:
                report["parity"] = _run_workload(theirs, ours)
                if row.get("random") and report["parity"]["mismatch"] is None:
                    report["random"] = _run_random(theirs, ours, **row["random"])
            return report
        finally:
            for e in engines:
                e.shutdown()
            logging.getLogger("ironbatch.vllm").removeHandler(log)
            elapsed = time.monotonic() - started
            print(f"{row['id']} [{row['flavor']}]: {elapsed:.1f} s", file=sys.stderr)


def _run_workload(theirs: Engine, ours: Engine) -> dict[str, Any]:
    """The row's fixed workload through both engines; the first difference, if any."""
    vc = theirs.engine.vllm_config
    plan = (
        pooling_workload()
        if vc.model_config.runner_type == "pooling"
        else encoder_only_workload()
        if vc.is_mm_encoder_only
        else audio_workload()
        if vc.model_config.is_encoder_decoder
        else workload(
            lora=vc.lora_config is not None, images=vc.model_config.supports_multimodal_inputs
        )
    )
    drained = _drive(theirs, ours, plan, ticks=300)  # it drains in about 30
    return {"mismatch": _compare(theirs, ours, drained), "exercised": _exercised(theirs)}


def _drive(
    theirs: Engine, ours: Engine, plan: dict[int, list[tuple[str, Any]]], ticks: int
) -> bool:
    """A plan through both engines, tick by tick (arrivals and aborts first,
    then one engine step each, as EngineCoreProc's loop does), until both
    have drained past its last tick; whether they did within ``ticks``."""
    last = max(plan)
    for tick in range(ticks):
        for action, arg in plan.get(tick, []):
            theirs.apply(action, arg)
            ours.apply(action, arg)
        if tick > last and not theirs.busy() and not ours.busy():
            return True
        theirs.step()
        ours.step()
    return False


def _compare(theirs: Engine, ours: Engine, drained: bool) -> str | None:
    """The first difference between what the two engines recorded, if any:
    what the workers got, the grammar masks, each step's outputs and
    events, then the state each engine is left in."""
    mismatch = (
        _first_difference(theirs.executor.received, ours.executor.received, "SchedulerOutput")
        or _first_difference(theirs.executor.grammar, ours.executor.grammar, "grammar bitmask")
        or _first_difference(theirs.steps, ours.steps, "engine step (outputs, events, reasoning)")
    )
    final = [
        (
            e.scheduler.get_request_counts(),
            e.scheduler.get_num_unfinished_requests(),
            e.scheduler.get_kv_cache_usage(),
        )
        for e in (theirs, ours)
    ]
    if mismatch is None and final[0] != final[1]:
        mismatch = f"final state: vLLM {final[0]}, drop-in {final[1]}"
    if mismatch is None and not drained:
        held = {
            rid: (str(r.status), r.num_computed_tokens, r.num_tokens)
            for rid, r in theirs.scheduler.requests.items()
        }
        mismatch = f"the engines never drained (vLLM holds {held})"
    return mismatch


# -- random workloads (test_vllm_families.py) ----------------------------------------------

# Shared prefixes a row's random workloads draw from (and, cached by one
# workload, hit in a later one).
_PREFIXES = 3


def random_workload(
    rng: random.Random, tag: str, prefixes: list[list[int]], vc: VllmConfig, sessions: bool
) -> dict[int, list[tuple[str, Any]]]:
    """Arrivals and aborts by tick, drawn from ``rng``: 2 to 12 requests
    over the first 16 ticks, prompts as long as ``prefixes`` at most (most
    sharing a drawn length of one of them), 1 to 64 output tokens, and in
    some a stop token, prompt logprobs, a structured output, a cache salt
    (of two tenants), or an abort a few ticks after arrival; with prompt
    embeddings on, embeddings for some prompts (alone or mixed with token
    ids); under the priority policy, priorities 0 to 3;
    with LoRA on, an adapter of three in most;
    on a model that takes images, an image or two in some (of four, each
    its own length, so that requests share them); with ``sessions``, a
    streaming-input session in half. Requests are named ``{tag}-{j}``."""
    plan: dict[int, list[tuple[str, Any]]] = {}
    json_schema = StructuredOutputsParams(json={"type": "object"})
    sc = vc.scheduler_config
    # Prompt and output together, at most.
    longest = vc.model_config.max_model_len - 8
    if not sc.enable_chunked_prefill:
        # Without chunked prefill a request's tokens must fit a step whole,
        # its output too (a preempted request recomputes them), or it
        # waits at the head of the queue for good (in vLLM too).
        budget = sc.max_num_scheduled_tokens or sc.max_num_batched_tokens
        longest = min(longest, budget - vc.num_lookahead_tokens - 8)
    for j in range(rng.randint(2, 12)):
        tick = rng.randrange(16)
        max_tokens = rng.randint(1, min(64, longest // 2))
        length = rng.randint(1, min(len(prefixes[0]), longest - max_tokens))
        shared = rng.randint(0, length) if rng.random() < 0.7 else 0
        tail = [rng.randrange(5, 500) for _ in range(length - shared)]
        prompt = rng.choice(prefixes)[:shared] + tail
        kw: dict[str, Any] = {}
        if rng.random() < 0.2:
            kw["stop_token_ids"] = [rng.randrange(5, 102)]  # token_for's range
        if rng.random() < 0.1:
            kw["prompt_logprobs"] = 2
        if sc.policy == "priority":
            kw["priority"] = rng.randint(0, 3)
        kw["cache_salt"] = rng.choice([None, None, None, "tenant-a", "tenant-b"])
        if vc.model_config.enable_prompt_embeds and rng.random() < 0.4:
            # Each row fixed by its token (shared prefixes embed alike and
            # hit), now and then one that only looks shared.
            kw["prompt_embeds"] = torch.tensor(
                [[float(t) if rng.random() < 0.95 else rng.random()] * 8 for t in prompt]
            )
            if rng.random() < 0.5:
                kw["prompt_is_token_ids"] = [rng.random() < 0.5 for _ in prompt]
        if vc.lora_config is not None and rng.random() < 0.7:
            i = rng.randint(1, 3)
            kw["lora_request"] = LoRARequest(f"adapter-{i}", i, f"/adapters/{i}")
        if vc.model_config.supports_multimodal_inputs and rng.random() < 0.3:
            kw["mm"] = _random_images(rng, length)
        rid = f"{tag}-{j}"
        if rng.random() < 0.1:
            kw["structured_outputs"] = json_schema
            rid = f"json-{rid}"  # (token_for ends such a request's reasoning now and then)
        request = _request(rid, prompt, max_tokens, float(tick), **kw)
        plan.setdefault(tick, []).append(("add", request))
        if rng.random() < 0.15:
            plan.setdefault(tick + rng.randint(0, 12), []).append(("abort", rid))
    if sessions and rng.random() < 0.5:
        _random_session(rng, f"{tag}-session", plan)
    return plan


def _random_session(rng: random.Random, rid: str, plan: dict[int, list[tuple[str, Any]]]) -> None:
    """A streaming-input session in ``plan``: two to four input chunks of
    up to 60 tokens, a few ticks apart (one may come while the previous
    turn runs), each turn a few output tokens; the last chunk is not
    resumable, which ends the session."""
    chunks = rng.randint(2, 4)
    tick = rng.randrange(16)
    for c in range(chunks):
        prompt = [rng.randrange(5, 500) for _ in range(rng.randint(1, 60))]
        resumable = c < chunks - 1
        request = _request(rid, prompt, rng.randint(1, 4), float(tick), resumable=resumable)
        plan.setdefault(tick, []).append(("add", request))
        tick += rng.randint(1, 8)


# The random workloads' images: an identifier and its placeholder tokens.
_IMAGES = {"image-a": 16, "image-b": 32, "image-c": 48, "image-d": 64}


def _random_images(rng: random.Random, length: int) -> list[tuple[str, int, int]]:
    """One or two of the images placed in a prompt of ``length`` tokens,
    apart, in order (none if it is too short)."""
    images = []
    start = 0
    for name in rng.sample(sorted(_IMAGES), rng.randint(1, 2)):
        size = _IMAGES[name]
        if length - start < size:
            break
        offset = rng.randint(start, length - size)
        images.append((name, offset, size))
        start = offset + size
    return images


def _run_random(theirs: Engine, ours: Engine, seed: int, count: int) -> dict[str, Any]:
    """``count`` random workloads one after another through both engines
    (the cache carries over: a later workload hits an earlier one's
    prefixes), each drained and compared before the next; the first
    difference, with the workload's index and seed."""
    rng = random.Random(seed)
    vc = theirs.engine.vllm_config
    # Prefixes across three of the largest attention block (600 tokens at
    # least), so that hits span blocks (and preemptions come) wherever the
    # row's blocks are large; inside max_model_len with room for output.
    unit = max(
        (
            g.kv_cache_spec.block_size
            for g in theirs.scheduler.kv_cache_config.kv_cache_groups
            if type(g.kv_cache_spec).__name__ != "MambaSpec"
        ),
        default=0,
    )
    length = min(max(600, 3 * unit), vc.model_config.max_model_len - 72)
    prefixes = [[rng.randrange(5, 500) for _ in range(length)] for _ in range(_PREFIXES)]
    # A session (of 256 tokens at most) holds its blocks between turns and
    # nobody preempts it: only where every group's blocks hold it beside a
    # request of the model's length (else a request can wait for good, in
    # vLLM too); not speculating under pipeline parallelism (vLLM trips
    # its own session assertion).
    kv = theirs.scheduler.kv_cache_config
    room = kv.num_blocks * vc.cache_config.block_size // max(len(kv.kv_cache_groups), 1)
    sessions = room >= vc.model_config.max_model_len + 512 and not (
        vc.parallel_config.pipeline_parallel_size > 1 and vc.speculative_config is not None
    )
    exercised: Counter[str] = Counter()
    for i in range(count):
        workload_seed = rng.randrange(2**32)
        plan = random_workload(random.Random(workload_seed), f"w{i}", prefixes, vc, sessions)
        for e in (theirs, ours):  # each workload compared on its own
            e.executor.received.clear()
            e.executor.grammar.clear()
            e.steps.clear()
        mismatch = _compare(theirs, ours, _drive(theirs, ours, plan, ticks=5000))
        exercised.update(_exercised(theirs))
        exercised["workloads"] += 1
        if mismatch is not None:
            where = f"random workload {i} of seed {seed} (its own seed {workload_seed})"
            return {"mismatch": f"{where}: {mismatch}", "exercised": dict(exercised)}
    return {"mismatch": None, "exercised": dict(exercised)}


# -- mutations (test_vllm_families.py: each family's comparison must catch its own) ------


def _core_changed(
    scheduler: dict[str, Any] | None = None,
    cache: Callable[[CacheConfig], dict[str, Any]] | None = None,
) -> contextlib.AbstractContextManager:
    """The drop-in builds its core with these settings changed."""
    real = ironbatch.vllm.settings.CoreScheduler

    def build(scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> Any:
        return real(
            dataclasses.replace(scheduler_config, **(scheduler or {})),
            dataclasses.replace(cache_config, **(cache(cache_config) if cache else {})),
        )

    return mock.patch.object(ironbatch.vllm.settings, "CoreScheduler", build)


def _groups_changed(kind: str, **changes: Callable[[KVCacheGroup], Any]) -> Any:
    """The core's KV-cache groups of ``kind`` with fields changed."""

    def cache(config: CacheConfig) -> dict[str, Any]:
        groups = tuple(
            dataclasses.replace(g, **{k: f(g) for k, f in changes.items()}) if g.kind == kind else g
            for g in config.kv_cache_groups or ()
        )
        return {"kv_cache_groups": groups or None}

    return _core_changed(cache=cache)


def _drafts_shortened() -> contextlib.AbstractContextManager:
    """Each request's drafts reach the core one token short."""
    take = ironbatch.vllm.speculation.Speculation.take_drafts

    def take_but_drop_the_last(self: Any, drafts: DraftTokenIds) -> None:
        shorter = [d[:-1] for d in drafts.draft_token_ids]
        take(self, DraftTokenIds(req_ids=drafts.req_ids, draft_token_ids=shorter))

    return mock.patch.object(
        ironbatch.vllm.speculation.Speculation, "take_drafts", take_but_drop_the_last
    )


# Ways to break the drop-in, each shown by the rows of the families that name it.
MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    # (vLLM's default retention caches only the states a later request
    # resumes from.)
    "every recurrent state kept cached": lambda: _core_changed(
        cache=lambda c: {"sparse_retention": False}
    ),
    "windows 16 tokens wider": lambda: _groups_changed(
        "sliding_window", size=lambda g: g.size + 16
    ),
    "no prefill read-ahead for the MTP modules": lambda: _core_changed(
        scheduler={"drafter_read_ahead": 0}
    ),
    "blocks not widened by decode context parallelism": lambda: _core_changed(
        cache=lambda c: {"block_size": c.block_size // 2}
    ),
    "drafts one token short": _drafts_shortened,
    "the priority policy taken as FCFS": lambda: _core_changed(scheduler={"policy": "fcfs"}),
    # (An offloading connector stores the blocks a later request can resume
    # from by it.)
    "no shared-prefix boundary on vLLM's Request": lambda: mock.patch.object(
        ironbatch._core, "vllm_shared_prefix_boundary", lambda core, slot: 0
    ),
}


def main(rows_path: str, report_path: str) -> None:
    # EngineCore collects all garbage when it is built and again when it is
    # shut down (it expects one engine per process, for the process's life);
    # this process builds two engines per row, and those full collections of
    # torch's and vLLM's heap would take most of its time. Neither bears on
    # the scheduler; the torch.distributed teardown goes with the second.
    engine_core_module.freeze_gc_heap = lambda: None
    engine_core_module.cleanup_dist_env_and_memory = lambda: None
    logging.getLogger("ironbatch.vllm").setLevel(logging.INFO)
    with open(rows_path) as f:
        rows = json.load(f)
    root = os.path.dirname(os.path.abspath(report_path))  # the caller's scratch directory
    # Every model's layers first: EngineCore's shutdown tears down the
    # torch.distributed state that building them needs.
    specs_cache = {
        (name, flags, gpu_only): ModelSpecs(write_model(root, name), flags, gpu_only)
        for name, flags, gpu_only in dict.fromkeys(specs_key(r) for r in rows)
    }
    report: dict[str, Any] = {}
    for row in rows:
        key = f"{row['id']}[{row['flavor']}]"
        try:
            report[key] = run_row(row, root, specs_cache)
        except Exception:
            report[key] = {"error": traceback.format_exc()}
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    # torch.distributed's gloo group and vLLM's worker threads can hold the
    # interpreter's exit for seconds; the report is written, so leave now.
    os._exit(0)
