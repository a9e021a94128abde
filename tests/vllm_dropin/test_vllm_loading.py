"""Loading the drop-in the way vLLM does, and the fallback to vLLM's own
scheduler for what the Rust core does not cover yet."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

pytest.importorskip("vllm")

from vllm.config import (  # noqa: E402
    KVEventsConfig,
    LoRAConfig,
    SpeculativeConfig,
    StructuredOutputsConfig,
)
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.interface import PauseState, SchedulerInterface  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler  # noqa: E402
from vllm.v1.engine import FinishReason  # noqa: E402

import ironbatch.vllm  # noqa: E402
from ironbatch.bench.vllm_standin_connector import kv_transfer_config  # noqa: E402
from ironbatch.bench.vllm_standin_ec_connector import ec_transfer_config  # noqa: E402

import vllm_setup  # noqa: E402

CLS = "ironbatch.vllm.Scheduler"


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_scheduler_cls_resolves_and_constructs_like_engine_core(async_scheduling: bool) -> None:
    vc, kvc = vllm_setup.vllm_config(CLS, async_scheduling=async_scheduling)
    cls = vc.scheduler_config.get_scheduler_cls()  # what EngineCore calls
    assert cls is ironbatch.vllm.Scheduler
    s = vllm_setup.construct(cls, vc, kvc)
    assert type(s) is ironbatch.vllm.Scheduler and isinstance(s, SchedulerInterface)
    # EngineCore reads these right after construction.
    assert s.connector is None and s.ec_connector is None and s.get_kv_connector() is None
    assert s.get_kv_event_publisher_config() is None
    assert not s.has_requests() and s.get_request_counts() == (0, 0)
    assert s.pause_state == PauseState.UNPAUSED


def test_scheduler_cls_as_a_class_object() -> None:
    vc, kvc = vllm_setup.vllm_config(ironbatch.vllm.Scheduler)
    assert vc.scheduler_config.get_scheduler_cls() is ironbatch.vllm.Scheduler


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (
            # (vLLM's own lookup fails there past a first request.)
            {
                "speculative_config": {"method": "mtp", "num_speculative_tokens": 3},
                "target": "deepseek_mtp",
                "mla": True,
                "num_mtp_layers": 3,
                "kv_layout": "mamba",
                "enable_prefix_caching": True,
            },
            "multi-module MTP beside Mamba groups alone with prefix caching on",
        ),
    ],
    ids=["multi-module-mtp-beside-states-alone"],
)
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_unsupported_config_falls_back_to_vllm_and_says_why(
    overrides: dict, why: str, async_scheduling: bool, caplog: pytest.LogCaptureFixture
) -> None:
    vc, kvc = vllm_setup.vllm_config(CLS, async_scheduling=async_scheduling, **overrides)
    with caplog.at_level(logging.WARNING, logger="ironbatch.vllm"):
        s = vllm_setup.construct(vc.scheduler_config.get_scheduler_cls(), vc, kvc)
    expected = AsyncScheduler if async_scheduling else VllmScheduler
    assert type(s) is expected
    lines = [r.getMessage() for r in caplog.records if r.name == "ironbatch.vllm"]
    assert len(lines) == 1 and why in lines[0] and expected.__name__ in lines[0], lines
    # The fallback is a working scheduler (a recurrent state's block-aligned
    # split may hold the prompt's last token back).
    s.add_request(vllm_setup.make_request("a", range(3, 20), 2))
    assert s.schedule().num_scheduled_tokens["a"] in (16, 17)


def test_kv_and_encoder_cache_connectors_together_engage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Both connectors on a vision model: the drop-in schedules them (the
    connector differential proves it equal to vLLM, errors and transfers
    settled in one update in vLLM's order), and warns of nothing."""
    with caplog.at_level(logging.WARNING, logger="ironbatch.vllm"):
        s = vllm_setup.make_scheduler(
            "ironbatch",
            target="vision",
            async_scheduling=False,
            kv_transfer_config=kv_transfer_config(0),
            ec_transfer_config=ec_transfer_config(0),
        )
    assert type(s) is not VllmScheduler
    assert s.connector is not None and s.ec_connector is not None
    assert [r.getMessage() for r in caplog.records if r.name == "ironbatch.vllm"] == []


@pytest.mark.parametrize("caching", [False, True])
def test_chunked_local_blocks_smaller_than_others_fall_back_only_with_prefix_caching(
    caching: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Llama 4's chunked groups in blocks of 8 beside full attention's of
    16: vLLM's own prefix lookup asserts there, so with prefix caching on
    the drop-in hands the engine to vLLM's scheduler and says why; with it
    off it schedules them."""
    settings = {"kv_layout": "llama4", "window": 16, "block_size": 8, "full_block_size": 16}
    vc, kvc = vllm_setup.vllm_config(CLS, enable_prefix_caching=caching, **settings)
    with caplog.at_level(logging.WARNING, logger="ironbatch.vllm"):
        s = vllm_setup.construct(vc.scheduler_config.get_scheduler_cls(), vc, kvc)
    lines = [r.getMessage() for r in caplog.records if r.name == "ironbatch.vllm"]
    if caching:
        assert type(s) is VllmScheduler
        assert len(lines) == 1 and "vLLM asserts at a prefix lookup" in lines[0], lines
    else:
        assert type(s) is ironbatch.vllm.Scheduler and not lines, lines


def test_another_vllm_version_falls_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    vc, kvc = vllm_setup.vllm_config(CLS)
    with caplog.at_level(logging.WARNING, logger="ironbatch.vllm"):
        s = vllm_setup.construct(vc.scheduler_config.get_scheduler_cls(), vc, kvc)
    assert type(s) is VllmScheduler
    assert "vLLM 0.34.0" in caplog.text


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_structured_outputs_and_reasoning_parsers_keep_the_drop_in(async_scheduling: bool) -> None:
    """What production turns on for tool calling and JSON output (an explicit
    grammar backend, a reasoning parser; gpt-oss sets one itself) is
    scheduled by the core, not handed to vLLM's scheduler."""
    so = StructuredOutputsConfig(backend="xgrammar", reasoning_parser="qwen3")
    vc, kvc = vllm_setup.vllm_config(
        CLS, async_scheduling=async_scheduling, structured_outputs_config=so
    )
    s = vllm_setup.construct(vc.scheduler_config.get_scheduler_cls(), vc, kvc)
    assert type(s) is ironbatch.vllm.Scheduler


@pytest.mark.parametrize(
    "parallel",
    [
        {"pipeline_parallel_size": 2},
        {"pipeline_parallel_size": 3, "async_scheduling": True},
        {"data_parallel_size": 2, "prefill_schedule_interval": 4},
        {"prefill_schedule_interval": 4},
    ],
    ids=["pp-sync", "pp-async", "dp-throttled", "local-cadence"],
)
def test_pipeline_and_data_parallel_engines_keep_the_drop_in(parallel: dict) -> None:
    """What this engine's scheduler sees of pipeline and data parallelism
    (a batch queue, a decode stagger, prefill holds) is the core's."""
    s = vllm_setup.make_scheduler("ironbatch", **parallel)
    assert type(s) is ironbatch.vllm.Scheduler


def test_kv_events_keep_the_drop_in_and_publish_like_vllm() -> None:
    """KV-aware routing (--kv-events-config): the drop-in makes vLLM's
    publisher from the same config, reports its resolved config to the
    engine, and shuts it down with itself."""
    events = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    vc, kvc = vllm_setup.vllm_config(CLS, kv_events_config=events)
    s = vllm_setup.construct(vc.scheduler_config.get_scheduler_cls(), vc, kvc)
    assert type(s) is ironbatch.vllm.Scheduler
    assert type(s.kv_event_publisher).__name__ == "NullEventPublisher"
    assert s.get_kv_event_publisher_config() is None  # what vLLM's null publisher reports
    s.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_lora_engages_with_max_loras(async_scheduling: bool) -> None:
    """LoRA is the core's (docs/scheduling.md §4.14): the drop-in engages,
    with vLLM's max_loras."""
    lora = LoRAConfig(max_loras=1, max_lora_rank=8)
    s = vllm_setup.make_scheduler("ironbatch", async_scheduling=async_scheduling, lora_config=lora)
    assert type(s).__module__ == "ironbatch.vllm.scheduler"
    for i, rid in enumerate(("a", "b")):
        lora = LoRARequest(f"adapter-{rid}", i + 1, f"/adapters/{rid}")
        s.add_request(
            vllm_setup.make_request(rid, range(3, 20), 4, arrival_time=i, lora_request=lora)
        )
    assert s.schedule().num_scheduled_tokens == {"a": 17}  # b's adapter would be a second


def test_an_adapter_without_a_lora_config_is_scheduled_as_vllm_does() -> None:
    """vLLM's scheduler checks max_loras only with a LoRA config (its
    engine's input processor refuses such a request before); the drop-in
    schedules it as vLLM's scheduler does."""
    for backend in ("vllm", "ironbatch"):
        s = vllm_setup.make_scheduler(backend)
        for i, rid in enumerate(("a", "b")):
            lora = LoRARequest(f"adapter-{rid}", i + 1, f"/adapters/{rid}")
            s.add_request(
                vllm_setup.make_request(rid, range(3, 20), 4, arrival_time=i, lora_request=lora)
            )
        # Both admitted, and b shares no prefix with a's other adapter.
        assert s.schedule().num_scheduled_tokens == {"a": 17, "b": 17}, backend


def test_unsupported_request_is_finished_with_an_error() -> None:
    """A streaming session whose prompt is embeddings (not the core's yet):
    refused with a request-level error, never scheduled."""
    s = vllm_setup.make_scheduler("ironbatch")
    bad = vllm_setup.make_request("bad", range(3, 20), 4, resumable=True)
    bad.prompt_embeds = torch.zeros(17, 8)
    s.add_request(bad)
    s.add_request(vllm_setup.make_request("good", range(3, 20), 4))
    assert s.has_requests() and not s.has_request("bad")
    so = s.schedule()
    assert so.num_scheduled_tokens == {"good": 17}
    outs = s.update_from_output(so, vllm_setup.runner_output(so, {"good": [5]}))
    by_id = {o.request_id: o for o in outs[0].outputs}
    assert by_id["bad"].finish_reason == FinishReason.ERROR
    assert "prompt embeddings in a streaming session" in by_id["bad"].error.message
    assert by_id["good"].new_token_ids == [5]


@pytest.mark.parametrize("log_stats", [True, False], ids=["stats", "no-stats"])
def test_waiting_requests_stay_out_of_the_per_step_output_check(log_stats: bool) -> None:
    """Every step's outputs are checked against the slots whose next output
    carries more than tokens; a waiting request has no output, so it joins
    that set only when admitted (with a long queue, the set would otherwise
    cost the step time in proportion to the queue). Its first output still
    carries what vLLM's does: prefill stats and, with stats on, its events."""
    outputs = {}
    for kind in ("vllm", "ironbatch"):
        s = vllm_setup.make_scheduler(kind, max_num_seqs=1, log_stats=log_stats)
        for rid in ("a", "b"):
            s.add_request(vllm_setup.make_request(rid, range(3, 20), 1))
        so = s.schedule()
        assert list(so.num_scheduled_tokens) == ["a"]
        if kind == "ironbatch":
            mirror = s._mirror
            assert mirror.full_output_slots == {mirror.slot_of["a"]}
        first = s.update_from_output(so, vllm_setup.runner_output(so, {"a": [5]}))
        so = s.schedule()  # "a" finished at max_tokens=1: "b" is admitted
        assert list(so.num_scheduled_tokens) == ["b"]
        second = s.update_from_output(so, vllm_setup.runner_output(so, {"b": [6]}))
        outputs[kind] = [o for ecos in (first, second) for o in ecos[0].outputs]
    for ours, theirs in zip(outputs["ironbatch"], outputs["vllm"], strict=True):
        assert ours.request_id == theirs.request_id
        assert (ours.prefill_stats is None) == (theirs.prefill_stats is None)
        assert ours.prefill_stats is not None
        ours_events = [e.type for e in ours.events or ()]
        assert ours_events == [e.type for e in theirs.events or ()]
        assert bool(ours_events) == log_stats


def test_bad_input_gets_a_clear_error_and_changes_nothing() -> None:
    s = vllm_setup.make_scheduler("ironbatch")
    s.add_request(vllm_setup.make_request("a", range(3, 20), 4))
    with pytest.raises(ValueError, match="already in the scheduler"):
        s.add_request(vllm_setup.make_request("a", range(3, 20), 4))
    so = s.schedule()
    with pytest.raises(ValueError, match="req_id_to_index has no row"):
        s.update_from_output(
            so,
            vllm_setup.runner_output(so, {}).__class__(
                req_ids=[], req_id_to_index={}, sampled_token_ids=[[5]]
            ),
        )
    with pytest.raises(ValueError, match="neither -1 nor a token id"):
        s.update_from_output(so, vllm_setup.runner_output(so, {"a": [-5]}))
    s.update_from_output(so, vllm_setup.runner_output(so, {"a": [5]}))  # still applies
    with pytest.raises(ValueError, match="already applied"):
        s.update_from_output(so, vllm_setup.runner_output(so, {"a": [5]}))
    assert s.schedule().num_scheduled_tokens == {"a": 1}


def test_importing_ironbatch_does_not_import_vllm() -> None:
    code = "import sys, ironbatch; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_ngram_speculation_keeps_the_drop_in(async_scheduling: bool) -> None:
    """n-gram speculative decoding (no drafter of its own, so no lookahead
    slots) is scheduled by the core: drafts in, rejections rolled back."""
    spec = SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_max=3, prompt_lookup_min=1
    )
    vc, kvc = vllm_setup.vllm_config(
        CLS, async_scheduling=async_scheduling, speculative_config=spec
    )
    s = vllm_setup.construct(vc.scheduler_config.get_scheduler_cls(), vc, kvc)
    assert type(s) is ironbatch.vllm.Scheduler
    s.add_request(vllm_setup.make_request("a", range(3, 20), 8))
    so = s.schedule()
    assert so.num_scheduled_tokens == {"a": 17} and so.num_spec_tokens_to_schedule == 3


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_gpu_ngram_speculation_keeps_the_drop_in(async_scheduling: bool) -> None:
    spec = {"method": "ngram_gpu", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    vc, kvc = vllm_setup.vllm_config(
        CLS, async_scheduling=async_scheduling, speculative_config=spec
    )
    s = vllm_setup.construct(vc.scheduler_config.get_scheduler_cls(), vc, kvc)
    assert type(s) is ironbatch.vllm.Scheduler


@pytest.mark.parametrize("method", ["suffix", "dspark", "custom_class"])
def test_every_speculative_method_of_vllm_engages(method: str) -> None:
    """Suffix decoding, DSpark and a proposer class of the user's, the
    last methods the differential test proved: each engages on the model
    runner vLLM runs it on (V2 for DSpark, V1 for the others)."""
    spec = {"method": method, "num_speculative_tokens": 3}
    with vllm_setup.env_var("VLLM_USE_V2_MODEL_RUNNER", "1" if method == "dspark" else "0"):
        vc, kvc = vllm_setup.vllm_config(CLS, async_scheduling=False, speculative_config=spec)
        s = vllm_setup.construct(vc.scheduler_config.get_scheduler_cls(), vc, kvc)
    assert type(s) is ironbatch.vllm.Scheduler
    s.add_request(vllm_setup.make_request("a", range(3, 20), 8))
    assert s.schedule().num_scheduled_tokens == {"a": 17}


def test_a_speculative_method_of_another_version_falls_back_and_says_which(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A method vLLM 0.33 does not have (a later version's) is vLLM's to
    schedule: no test has shown the core its drafts. An n-gram config
    stands in with the method's name: the name is all the check reads."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    vc, kvc = vllm_setup.vllm_config(CLS, speculative_config=spec)
    object.__setattr__(vc.speculative_config, "method", "lookahead_decoding")
    with caplog.at_level(logging.WARNING, logger="ironbatch.vllm"):
        s = vllm_setup.construct(vc.scheduler_config.get_scheduler_cls(), vc, kvc)
    assert type(s) is VllmScheduler
    assert "the 'lookahead_decoding' speculative method" in caplog.text


def test_a_vision_model_engages_and_so_does_a_realtime_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Images are the core's (docs/scheduling.md §4.15), so a vision model
    engages; a realtime model's streaming sessions bring audio in later
    chunks, which the core takes as vLLM's scheduler does (§4.12), so it
    engages too (no such model builds offline: its class is stood in for)."""
    s = vllm_setup.make_scheduler("ironbatch", target="vision")
    assert type(s).__module__ == "ironbatch.vllm.scheduler"
    from vllm.model_executor.models import ModelRegistry

    class Realtime:
        supports_realtime = True

    monkeypatch.setattr(ModelRegistry, "resolve_model_cls", lambda *a, **k: (Realtime, "x"))
    with caplog.at_level(logging.WARNING, logger="ironbatch.vllm"):
        s = vllm_setup.make_scheduler("ironbatch", target="vision")
    assert type(s).__module__ == "ironbatch.vllm.scheduler"
    assert "does not support" not in caplog.text
