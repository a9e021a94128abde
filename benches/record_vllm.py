"""Record ironbatch-trace/1 traces from an installed vLLM's own Scheduler, so
anyone can check ironbatch's parity on new workloads (replay them with
``ironbatch replay``). Each seed draws a configuration (block size, cache
size from tight to ample, budget, chunked prefill, threshold, prefix caching,
policy) and a workload (shared prefixes, duplicate prompts, stop tokens, EOS,
aborts); the "sampled" tokens are a deterministic function of the seed.
With ``--spec METHOD`` vLLM's scheduler speculates (k drafts): after each
step's output the recorder gives it random drafts, and a verification
accepts a random prefix of the drafts a step scheduled. METHOD is ``ngram``
(no drafter model), one with a drafter of its own (``eagle``, ``eagle3``,
``mtp``, ``draft_model``: lookahead KV slots, lookahead block hashes, a
drafting slot in the budget, as vLLM derives them), or ``mixed`` (one of
the five drawn per seed). With ``--layout LAYOUT`` vLLM's KV cache is a
hybrid model's: gpt-oss's (a sliding window, then full attention), Gemma 3's
(five sliding windows, then full attention) or Llama 4's (three chunked-local
groups, then full attention), or ``mixed`` (one of those drawn per seed),
with the window or chunk and vLLM's window retention drawn per seed; or
Qwen3-Next's (three linear-attention groups, then full attention) or
Jamba's (a Mamba group, then full attention), prefix caching off. With ``--lora``,
vLLM's LoRA config (max_loras 1 to 4) and most requests under one of up to
8 adapters (``lora_request`` in each request object, ``max_loras`` in the
config). With ``--connector NAME``, vLLM's scheduler runs with a KV
connector (``standin``, the seeded stand-in; ``nixl``, NixlConnector as a
P/D decode instance; ``offloading``, OffloadingConnector; see
``ironbatch.bench.connector_recording``), and the trace records its calls
with the connector's answers and each step's transfer report.

    python benches/record_vllm.py OUTDIR --seeds 100-119 [--big]
        [--spec METHOD [--k K] | --layout LAYOUT] [--lora] [--images]
        [--connector NAME]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

from vllm.config import LoRAConfig, SpeculativeConfig
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import RequestStatus

import ironbatch.bench.vllm_driver as vs
from ironbatch.bench.connector_recording import CONNECTORS, ConnectorCalls, draw_connector
from ironbatch.bench.random_speculation import RandomSpeculation
from ironbatch.trace.connector import CALLS, CONNECTOR, REPORT, report_record
from ironbatch.trace.speculation import stats_record
from ironbatch.vllm import harness
from ironbatch.vllm.settings import kv_cache_groups

VOCAB, EOS = 256, 2
# Speculative methods whose drafter has a forward pass of its own: vLLM
# gives them lookahead slots, lookahead block hashes or drafting slots.
DRAFTER_METHODS = ("eagle", "eagle3", "mtp", "draft_model")
SPEC_METHODS = ("ngram", *DRAFTER_METHODS)
# Hybrid KV-cache layouts (the harness's ``kv_layout``) and their attention
# KV-cache groups: gpt-oss a sliding window and full attention, Gemma 3 five
# windows and full attention, Llama 4 three chunked-local groups and full
# attention; Qwen3-Next and Jamba full attention beside recurrent states
# (RECURRENT_GROUPS of them: three linear-attention groups, one Mamba group),
# prefix caching off, a state block of max_model_len per group and request;
# or, as "qwen3-next-align" and "jamba-align", prefix caching on (vLLM's
# mamba_cache_mode "align": states of the block size, Mamba2's prefill
# checkpoints in some).
LAYOUT_GROUPS = {"gpt-oss": 2, "gemma3": 6, "llama4": 4, "qwen3-next": 1, "jamba": 1}
RECURRENT_GROUPS = {"qwen3-next": 3, "jamba": 1}
ALIGNED = ("qwen3-next-align", "jamba-align")
LAYOUTS = (*LAYOUT_GROUPS, *ALIGNED)


def draw_config(rng: random.Random) -> dict[str, Any]:
    bs = rng.choice([4, 8, 16])
    max_model_len = rng.choice([64, 128, 256])
    chunked = rng.random() < 0.75
    batched = rng.choice([32, 64, 128, 256, 512])
    if not chunked:
        batched = max(batched, max_model_len)
    per_seq = -(-max_model_len // bs)
    tight = rng.random() < 0.6
    seqs = rng.choice([2, 4, 8, 16, 32])
    return {
        "block_size": bs,
        "num_blocks": rng.randint(per_seq + 1, 3 * per_seq)
        if tight
        else rng.randint(8 * per_seq, 20 * per_seq),
        "max_num_seqs": seqs,
        "max_num_batched_tokens": max(batched, seqs),
        "max_model_len": max_model_len,
        "enable_chunked_prefill": chunked,
        "long_prefill_token_threshold": rng.choice([0, 0, 0, 8, 24, 40]),
        "enable_prefix_caching": rng.random() < 0.7,
        "policy": rng.choice(["fcfs", "fcfs", "priority"]),
    }


def draw_requests(
    rng: random.Random, cfg: dict[str, Any], big: bool, capacity: int | None = None
) -> list[dict[str, Any]]:
    """The workload. ``capacity``: the most tokens a request may reach (its
    prompt plus ``max_tokens``), where that is below ``max_model_len``; None
    (every trace but a drafter method's) leaves the draws as they were."""
    limit = cfg["max_model_len"] if capacity is None else min(cfg["max_model_len"], capacity)
    top = limit - 2
    prefixes = [
        [rng.randrange(3, VOCAB) for _ in range(rng.randint(4, top // 2))] for _ in range(3)
    ]
    out: list[dict[str, Any]] = []
    at_step = 0
    for i in range(rng.randint(120, 300) if big else rng.randint(6, 40)):
        at_step += rng.choice([0, 0, 0, 1, 1, 2, 5])
        n = rng.randint(1, top)
        if out and rng.random() < 0.15:
            prompt = list(rng.choice(out)["prompt_token_ids"])
        elif rng.random() < 0.5:
            head = rng.choice(prefixes)[:n]
            prompt = head + [rng.randrange(3, VOCAB) for _ in range(n - len(head))]
        else:
            prompt = [rng.randrange(3, VOCAB) for _ in range(n)]
        max_tokens = rng.randint(1, 48)
        if capacity is not None:
            max_tokens = min(max_tokens, limit - n)
        out.append(
            {
                "request_id": f"r{i}",
                "prompt_token_ids": prompt,
                "max_tokens": max_tokens,
                "min_tokens": min(rng.choice([0, 0, 0, 2, 5]), max_tokens),
                "ignore_eos": rng.random() < 0.3,
                "stop_token_ids": rng.choice([[], [], [7], [11, 13]]),
                "eos_token_id": EOS,
                "priority": rng.randint(0, 3) if cfg["policy"] == "priority" else 0,
                "arrival_time": round(at_step + i * 1e-3, 6),
                "_step": at_step,
                "_p_eos": rng.choice([0.0, 0.02, 0.08]),
            }
        )
    return out


def sampled_token(seed: int, r: dict[str, Any], index: int) -> int:
    rng = random.Random(f"{seed}:{r['request_id']}:{index}")
    if rng.random() < r["_p_eos"]:
        return EOS
    if r["stop_token_ids"] and rng.random() < 0.03:
        return r["stop_token_ids"][0]
    return rng.randrange(3, VOCAB)


def draw_num_speculative_tokens(seed: int) -> int:
    """k for ``--spec`` without ``--k``: 1..5, from a stream of its own (the
    config and workload draws stay those of the seed)."""
    return random.Random(f"ironbatch-record-k-{seed}").randint(1, 5)


def draw_method(seed: int) -> str:
    """The method ``--spec mixed`` records for ``seed``, from a stream of
    its own."""
    return random.Random(f"ironbatch-record-method-{seed}").choice(SPEC_METHODS)


def draw_layout(seed: int, layout: str, block_size: int) -> dict[str, Any]:
    """The harness's KV-cache settings for ``--layout layout`` (``mixed``:
    one of LAYOUTS drawn per seed), from a stream of their own: a window or
    chunk from under a block to several (chunks whole blocks, as vLLM's
    chunked attention needs), and vLLM's engine default retention interval
    0 (sparse window caching) three times in four, else None (dense)."""
    rng = random.Random(f"ironbatch-record-layout-{seed}")
    if layout == "mixed":  # (the window layouts, as before the recurrent ones)
        layout = rng.choice([x for x in LAYOUT_GROUPS if x not in RECURRENT_GROUPS])
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS} or mixed, got {layout!r}")
    if layout in RECURRENT_GROUPS:
        return {"kv_layout": layout}  # nothing to draw: states of max_model_len
    if layout in ALIGNED:
        # States of the block size; Mamba2's prefill checkpoints in half.
        alignment = rng.choice([None, 1])
        return {"kv_layout": layout.removesuffix("-align"), "mamba_checkpoint_alignment": alignment}
    return harness.draw_layout(rng, layout, block_size)
    return harness.draw_layout(rng, layout, block_size)


def group_records(groups: Any) -> list[dict[str, Any]]:
    """The trace's ``kv_cache_groups`` for the core's groups (vLLM's, with
    its admission caps, as ``ironbatch.vllm.settings`` derives them)."""
    records: list[dict[str, Any]] = []
    for g in groups:
        record: dict[str, Any] = {"kind": g.kind}
        if g.kind != "full":
            record["size"] = g.size
            if g.admission_cap_blocks is not None:
                record["admission_cap_blocks"] = g.admission_cap_blocks
            if g.speculative_blocks:
                record["speculative_blocks"] = g.speculative_blocks
            if g.prefill_checkpoint_alignment is not None:
                record["prefill_checkpoint_alignment"] = g.prefill_checkpoint_alignment
        records.append(record)
    return records


def ngram_config(k: int) -> SpeculativeConfig:
    """vLLM's n-gram method: no drafter model, so no lookahead slots, no
    lookahead hashes and no drafting slots. The recorder supplies the drafts."""
    return SpeculativeConfig(
        method="ngram", num_speculative_tokens=k, prompt_lookup_max=3, prompt_lookup_min=1
    )


def drafter_settings(method: str, k: int) -> dict[str, Any]:
    """The harness settings for a drafter method: vLLM's
    ``--speculative-config`` dict (the harness supplies a tiny drafter config)
    and, for MTP, a DeepSeek-shaped target with MLA, whose MTP layer drafts."""
    settings: dict[str, Any] = {
        "speculative_config": {"method": method, "num_speculative_tokens": k}
    }
    if method == "mtp":
        settings.update(target="deepseek_mtp", mla=True)
    return settings


def record(
    seed: int,
    big: bool = False,
    max_steps: int = 3000,
    num_speculative_tokens: int = 0,
    method: str = "ngram",
    layout: str | None = None,
    lora: bool = False,
    images: bool = False,
    connector: str | None = None,
) -> list[dict[str, Any]]:
    """The trace of ``seed``: its header, then one line per step. ``layout``
    (one of LAYOUTS, or ``mixed``): a hybrid KV cache, its window drawn per
    seed; None (the default) one full-attention group. ``lora``: vLLM's
    LoRA config with max_loras 1-4, and most requests under one of up to 8
    adapters (drawn apart, so the rest of the trace is as without).
    ``connector`` (one of CONNECTORS): vLLM's scheduler with that KV
    connector, its settings and worker drawn apart as well."""
    if method not in SPEC_METHODS:
        raise ValueError(f"method must be one of {SPEC_METHODS}, got {method!r}")
    if layout is not None and num_speculative_tokens:
        raise ValueError("a hybrid layout is recorded without speculative decoding")
    rng = random.Random(f"ironbatch-record-{seed}")
    cfg = draw_config(rng)
    hybrid: dict[str, Any] = {}
    if layout is not None:
        hybrid = draw_layout(seed, layout, cfg["block_size"])
        # Every group holds a table of its own: the cache drawn for one group
        # in each, so a tight cache stays as tight per group.
        cfg["num_blocks"] = (cfg["num_blocks"] - 1) * LAYOUT_GROUPS[hybrid["kv_layout"]] + 1
        # Recurrent states: a block per group for each request that runs,
        # and no prefix caching (vLLM's cache mode "none"); or with it
        # ("align"), room for two requests' states (four blocks per group each),
        # chunked prefill (vLLM requires it) and a budget of more than a
        # block (else no chunk ends on one).
        states = RECURRENT_GROUPS.get(hybrid["kv_layout"], 0)
        aligned = "mamba_checkpoint_alignment" in hybrid
        if states and not aligned:
            cfg["num_blocks"] += states * cfg["max_num_seqs"]
            cfg["enable_prefix_caching"] = False
        if aligned:
            cfg["num_blocks"] += 4 * states * 2
            cfg["enable_prefix_caching"] = True
            cfg["enable_chunked_prefill"] = True
            cfg["max_num_batched_tokens"] = max(
                cfg["max_num_batched_tokens"], 2 * cfg["block_size"]
            )
    spec: RandomSpeculation | None = None
    extras: dict[str, Any] = {}
    drafter = bool(num_speculative_tokens) and method != "ngram"
    if num_speculative_tokens:
        # Written only when speculating, so other traces stay as they were.
        cfg["num_speculative_tokens"] = num_speculative_tokens
        if drafter:
            extras = drafter_settings(method, num_speculative_tokens)
        else:
            extras["speculative_config"] = ngram_config(num_speculative_tokens)
        spec = RandomSpeculation(
            num_speculative_tokens=num_speculative_tokens,
            rng=random.Random(f"ironbatch-record-spec-{seed}"),
            eos_token_id=EOS,
            vocab_size=VOCAB,
        )
    lora_rng = random.Random(f"ironbatch-record-lora-{seed}")
    adapters = 0
    if lora:
        # Written only for LoRA traces, so other traces stay as they were.
        cfg["max_loras"] = lora_rng.randint(1, 4)
        adapters = lora_rng.randint(cfg["max_loras"] + 1, 8)
        extras["lora_config"] = LoRAConfig(max_loras=cfg["max_loras"], max_lora_rank=8)
    image_rng = random.Random(f"ironbatch-record-images-{seed}")
    if images:
        # A vision model (a tiny Qwen2.5-VL); its encoder budget and cache,
        # as its processor would give them, drawn per seed and written only
        # for image traces, so other traces stay as they were.
        cfg["encoder_compute_budget"] = image_rng.choice([16, 32, 64])
        cfg["encoder_cache_size"] = cfg["encoder_compute_budget"] * image_rng.choice([1, 2])
        extras.update(
            target="vision", mm_budget=(cfg["encoder_compute_budget"], cfg["encoder_cache_size"])
        )
    recorded_connector = None
    if connector is not None:
        if hybrid or num_speculative_tokens or lora or images:
            raise ValueError("a connector is recorded on a plain text model")
        recorded_connector = draw_connector(seed, connector)
        extras["kv_transfer_config"] = recorded_connector.kv_transfer_config
        # Written only for connector traces, so other traces stay as they were.
        cfg[CONNECTOR] = {"kv_load_failure_policy": recorded_connector.policy}
    sched = vs.build(cfg, **extras, **hybrid)
    calls = None if recorded_connector is None else ConnectorCalls(sched.connector)
    vc = sched.vllm_config
    # (Beside recurrent states of max_model_len tokens, the scheduler's block
    # is the least common multiple of the groups'.)
    expected = cfg["block_size"]
    if hybrid.get("kv_layout") in RECURRENT_GROUPS and not cfg["enable_prefix_caching"]:
        expected = math.lcm(expected, cfg["max_model_len"])
    if sched.block_size != expected:
        raise RuntimeError(f"vLLM chose block size {sched.block_size}, not {expected}")
    capacity = None
    if hybrid:
        # The groups as vLLM built them, with its admission caps, and its
        # window retention (written only for a hybrid layout, so other
        # traces stay as they were).
        groups = kv_cache_groups(vc, sched.kv_cache_config)
        states = RECURRENT_GROUPS.get(hybrid["kv_layout"], 0)
        if groups is None or len(groups) != LAYOUT_GROUPS[hybrid["kv_layout"]] + states:
            raise RuntimeError(f"vLLM built {groups} for {hybrid}")
        cfg["kv_cache_groups"] = group_records(groups)
        cfg["sparse_retention"] = sched.kv_cache_config.prefix_cache_retention_interval is not None
        if sched.kv_cache_config.prefix_cache_retention_interval:
            cfg["retention_interval"] = sched.kv_cache_config.prefix_cache_retention_interval
        # A request must fit the cache alone, a table in every group, or
        # vLLM preempts it for itself forever.
        attention = len(groups) - states
        held = 4 * states if cfg["enable_prefix_caching"] else states
        capacity = (cfg["num_blocks"] - 1 - held) // attention * cfg["block_size"]
    if drafter:
        # What vLLM derives from the method, as the trace's replay needs it
        # (only for these methods, so n-gram traces stay as they were).
        spec_config = vc.speculative_config
        cfg["num_lookahead_tokens"] = vc.num_lookahead_tokens
        cfg["num_hash_lookahead_tokens"] = vc.num_hash_lookahead_tokens
        cfg["num_draft_slots"] = spec_config.max_num_new_slots_for_drafting
        # A request must fit the cache alone with its drafts and lookahead
        # slots, or vLLM itself never finishes it: it preempts itself,
        # recomputes, gets drafts again.
        room = num_speculative_tokens + vc.num_lookahead_tokens
        capacity = (cfg["num_blocks"] - 1) * cfg["block_size"] - room
    reqs = draw_requests(rng, cfg, big, capacity)
    for r in reqs:
        if adapters and lora_rng.random() < 0.8:
            i = lora_rng.randint(1, adapters)
            r["lora_request"] = {
                "lora_int_id": i,
                "lora_name": f"adapter-{i}",
                "lora_path": f"/adapters/{i}",
            }
    if images:
        place_images(image_rng, reqs, cfg)
    if recorded_connector is not None and recorded_connector.remote_prefill_share:
        # A P/D decode instance: these requests' prompts were computed on
        # the prefill instance, whose blocks NIXL pulls.
        remote_rng = random.Random(f"ironbatch-record-remote-{seed}")
        for r in reqs:
            if remote_rng.random() < recorded_connector.remote_prefill_share:
                r["_kv_transfer_params"] = vs.remote_prefill_params(
                    r["request_id"], len(r["prompt_token_ids"]), cfg["block_size"]
                )
    by_id = {r["request_id"]: r for r in reqs}
    # EngineCore's block hasher covers this many tokens after each block.
    hash_lookahead = vc.num_hash_lookahead_tokens
    pending = sorted(reqs, key=lambda r: r["_step"])
    header: dict[str, Any] = {
        "format": "ironbatch-trace/1",
        "recorded_with": f"vllm {vs.VERSION}",
        "seed": seed,
    }
    if drafter:
        header["speculative_method"] = method  # informational, as recorded_with
    if hybrid:
        header["kv_layout"] = hybrid["kv_layout"]  # informational too
    if lora:
        header["lora_adapters"] = adapters  # informational too
    if recorded_connector is not None:
        header["kv_connector_name"] = recorded_connector.name  # informational too
    header["config"] = cfg
    lines: list[dict[str, Any]] = [header]
    drafts: list[list[Any]] = []  # given after the previous step's output
    for step in range(max_steps):
        if not pending and not sched.has_unfinished_requests():
            # A connector may still hold finished requests' blocks for a send.
            if recorded_connector is None or not (
                sched.has_requests() or recorded_connector.worker.busy
            ):
                break
        line: dict[str, Any] = {"step": step}
        if spec is not None:
            line["drafts"] = drafts
        line.update(add=[], abort=[])
        while pending and pending[0]["_step"] <= step:
            r = pending.pop(0)
            line["add"].append({k: v for k, v in r.items() if not k.startswith("_")})
            params = {"kv_transfer_params": r.get("_kv_transfer_params")}
            sched.add_request(vs.request(r | params, cfg["block_size"], hash_lookahead))
        # (A connector's held finished requests stay in the table: not live.)
        live = sorted(rid for rid, vr in sched.requests.items() if not vr.is_finished())
        if live and rng.random() < 0.04:
            victim = rng.choice(live)
            sched.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
            line["abort"].append(victim)
        so = sched.schedule()
        line["schedule"] = decisions(sched, so, per_group=bool(hybrid))
        if images:  # vLLM's dict: request id -> the images it encodes
            line["schedule"]["encoder_inputs"] = [
                [rid, list(ids)] for rid, ids in so.scheduled_encoder_inputs.items()
            ]
            line["schedule"]["free_encoder_mm_hashes"] = list(so.free_encoder_mm_hashes)
        if spec is not None:  # vLLM's dict, in scheduling order
            scheduled_drafts = so.scheduled_spec_decode_tokens
            line["schedule"]["spec_tokens"] = [
                [rid, list(scheduled_drafts[rid])]
                for rid in so.num_scheduled_tokens
                if scheduled_drafts.get(rid)
            ]
        ids = list(so.num_scheduled_tokens)
        tokens = [sample(seed, sched.requests[rid], by_id[rid], so, spec) for rid in ids]
        # Copies: vLLM trims a list in place where a stop ends the request.
        line["sampled"] = [[rid, list(t)] for rid, t in zip(ids, tokens, strict=True)]
        mro = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=tokens
        )
        if recorded_connector is not None:
            mro.kv_connector_output = recorded_connector.worker.report(so)
            # In the order vLLM iterates its sets, which no later process rebuilds.
            line[REPORT] = report_record(mro.kv_connector_output)
        engine_outputs = sched.update_from_output(so, mro)
        line["outputs"] = [
            [
                o.request_id,
                list(o.new_token_ids),
                None if o.finish_reason is None else str(o.finish_reason),
                o.stop_reason,
            ]
            for eco in engine_outputs.values()
            for o in eco.outputs
        ]
        if spec is not None:
            line["spec_decoding_stats"] = spec_stats(engine_outputs)
        if calls is not None:  # those of the aborts, schedule() and the update
            line[CALLS] = calls.take()
        line["num_free_blocks"] = sched.kv_cache_manager.block_pool.get_num_free_blocks()
        lines.append(line)
        if spec is not None:
            drafts = propose(sched, spec, ids, by_id)
    return lines


def sample(
    seed: int, r: Any, d: dict[str, Any], so: Any, spec: RandomSpeculation | None
) -> list[int]:
    """The tokens the model runner returns for vLLM's request ``r`` (trace
    request ``d``) after step ``so``: none for a prefill chunk; otherwise the
    drafts the verification accepted, a prefix of those scheduled, and one
    sampled token after them (what a rejection sampler returns)."""
    if r.num_computed_tokens < r.num_tokens:
        return []
    drafts = so.scheduled_spec_decode_tokens.get(r.request_id, [])
    kept = list(drafts[: spec.num_accepted(drafts)]) if spec is not None and drafts else []
    return kept + [sampled_token(seed, d, r.num_output_tokens + len(kept))]


def spec_stats(engine_outputs: dict[int, Any]) -> dict[str, Any] | None:
    """The step's SpecDecodingStats in the trace's shape: vLLM puts its
    SchedulerStats on one client's outputs (log_stats is on)."""
    stats = next((e.scheduler_stats for e in engine_outputs.values() if e.scheduler_stats), None)
    return stats_record(None if stats is None else stats.spec_decoding_stats)


def decisions(sched: Any, so: Any, per_group: bool = False) -> dict[str, Any]:
    """The trace's ``schedule`` object for vLLM's SchedulerOutput ``so``.
    ``per_group``: block ids as one list per KV-cache group (a trace with
    several groups); otherwise the one group's list."""
    num_groups = len(sched.kv_cache_config.kv_cache_groups)
    if not per_group and num_groups != 1:
        raise ValueError(f"{num_groups} KV-cache groups need per-group block ids")

    def block_ids(blocks: Any) -> list[Any]:
        if per_group:  # vLLM's tuple, one list per group; None: no group grew
            return [list(b) for b in blocks] if blocks else [[] for _ in range(num_groups)]
        return list(blocks[0]) if blocks else []

    new = {n.req_id: n for n in so.scheduled_new_reqs}
    cached = so.scheduled_cached_reqs
    row_of = {rid: i for i, rid in enumerate(cached.req_ids)}
    scheduled = []
    for rid, n in so.num_scheduled_tokens.items():
        if rid in new:
            kind = "resumed" if sched.requests[rid].num_preemptions else "new"
            scheduled.append(
                [rid, n, kind, new[rid].num_computed_tokens, block_ids(new[rid].block_ids)]
            )
        else:
            i = row_of[rid]
            kind = "resumed" if rid in cached.resumed_req_ids else "running"
            scheduled.append(
                [rid, n, kind, cached.num_computed_tokens[i], block_ids(cached.new_block_ids[i])]
            )
    return {
        "scheduled": scheduled,
        "preempted": sorted(so.preempted_req_ids or []),
        "finished": sorted(so.finished_req_ids),
    }


def propose(
    sched: Any, spec: RandomSpeculation, ids: list[str], by_id: dict[str, dict[str, Any]]
) -> list[list[Any]]:
    """Drafts for every request of the step just run, handed to vLLM's
    scheduler as EngineCore hands over its proposer's (sync scheduling), and
    returned for the next step line. Requests that stopped, and ones whose
    step was a prefill chunk, get drafts too: vLLM drops those."""
    given = []
    for rid in ids:
        r = sched.requests.get(rid)
        history = r.all_token_ids if r is not None else by_id[rid]["prompt_token_ids"]
        given.append(
            [rid, spec.drafts(history=history, stop_token_ids=by_id[rid]["stop_token_ids"])]
        )
    # vLLM keeps the lists it is given: it gets copies, the record stays as given.
    sched.update_draft_token_ids(
        DraftTokenIds(req_ids=[g[0] for g in given], draft_token_ids=[list(g[1]) for g in given])
    )
    return given


def place_images(rng: random.Random, reqs: list[dict[str, Any]], cfg: dict[str, Any]) -> None:
    """Up to three images in most requests' prompts (their placeholders
    overwrite prompt tokens), from a pool of up to six identifiers, so that
    requests share images; each image from one token to as long as the
    encoder can ever take, and short enough for the prompts."""
    most = min(cfg["encoder_compute_budget"], cfg["encoder_cache_size"], 48)
    bs = cfg["block_size"]
    pool = [
        (f"img-{i}", max(1, min(most, rng.choice([1, bs, bs + 3, most, rng.randint(1, most)]))))
        for i in range(rng.randint(2, 6))
    ]
    for r in reqs:
        prompt, features, pos = r["prompt_token_ids"], [], rng.randint(0, 4)
        for _ in range(rng.choice([0, 1, 2, 2, 3])):
            identifier, length = rng.choice(pool)
            if pos + length >= len(prompt):
                break
            prompt[pos : pos + length] = [IMAGE_TOKEN] * length
            features.append({"offset": pos, "length": length, "identifier": identifier})
            pos += length + rng.randint(0, 8)
        if features:
            r["mm_features"] = features


IMAGE_TOKEN = 5  # an image's placeholder token (the scheduler never reads it)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--seeds", default="0-9", help="an inclusive range, e.g. 100-119")
    ap.add_argument("--big", action="store_true", help="120-300 requests per trace")
    ap.add_argument("--prefix", default="recorded")
    ap.add_argument(
        "--spec",
        choices=[*SPEC_METHODS, "mixed"],
        help="speculative decoding with this method's scheduling (mixed: one drawn per seed):"
        " random drafts, random acceptance",
    )
    ap.add_argument(
        "--k", type=int, help="num_speculative_tokens with --spec (default: 1-5, drawn per seed)"
    )
    ap.add_argument(
        "--layout",
        choices=[*LAYOUTS, "mixed"],
        help="a hybrid model's KV-cache groups (mixed: one layout drawn per seed), the window"
        " or chunk and the window retention drawn per seed",
    )
    ap.add_argument(
        "--lora",
        action="store_true",
        help="LoRA on (max_loras 1-4 drawn per seed), most requests under one of up to 8 adapters",
    )
    ap.add_argument(
        "--images",
        action="store_true",
        help="a vision model (its encoder budget and cache drawn per seed), most requests with"
        " up to three images from a shared pool",
    )
    ap.add_argument(
        "--connector",
        choices=CONNECTORS,
        help="a KV connector on a plain text model (standin: the seeded stand-in; nixl: a P/D"
        " decode instance; offloading: CPU offloading), its settings drawn per seed",
    )
    a = ap.parse_args()
    if a.connector and (a.spec or a.layout or a.lora or a.images):
        ap.error("--connector records a plain text model: no --spec, --layout, --lora, --images")
    if a.images and (a.spec or a.layout or a.lora):
        ap.error("--images records a plain vision model: not with --spec, --layout or --lora")
    if a.k is not None and (a.spec is None or a.k < 1):
        ap.error("--k needs --spec and must be at least 1")
    if a.layout and a.spec:
        ap.error("--layout records without speculative decoding: not with --spec")
    lo, hi = (int(x) for x in a.seeds.split("-"))
    a.outdir.mkdir(parents=True, exist_ok=True)
    for seed in range(lo, hi + 1):
        k = (a.k or draw_num_speculative_tokens(seed)) if a.spec else 0
        method = draw_method(seed) if a.spec == "mixed" else a.spec or "ngram"
        lines = record(
            seed,
            a.big,
            num_speculative_tokens=k,
            method=method,
            layout=a.layout,
            lora=a.lora,
            images=a.images,
            connector=a.connector,
        )
        path = a.outdir / f"{a.prefix}-{seed:04d}.jsonl"
        path.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))
        pre = sum(len(x["schedule"]["preempted"]) for x in lines[1:])
        spec = f", {method}, k={k}, {accepted(lines)} drafts accepted" if k else ""
        if a.layout:
            spec = f", {describe_layout(lines[0])}"
        if a.connector:
            spec = f", {describe_connector(lines)}"
        print(f"{path}: {len(lines) - 1} steps, {pre} preemptions{spec}", file=sys.stderr)
    return 0


def describe_layout(header: dict[str, Any]) -> str:
    """``gpt-oss, sliding_window 9 (cap 17), sparse, prefix caching``: a
    hybrid trace's groups, as printed after it is written."""
    config = header["config"]
    kinds = [g for g in config["kv_cache_groups"] if g["kind"] != "full"]
    if kinds[0]["kind"] == "mamba":
        caching = "prefix caching" if config["enable_prefix_caching"] else "no prefix caching"
        return f"{header['kv_layout']}, {len(kinds)} × mamba {kinds[0]['size']}, {caching}"
    window = f"{kinds[0]['kind']} {kinds[0]['size']} (cap {kinds[0].get('admission_cap_blocks')})"
    retention = "sparse" if config["sparse_retention"] else "dense"
    if config.get("retention_interval"):
        retention += f" every {config['retention_interval']} tokens"
    caching = "prefix caching" if config["enable_prefix_caching"] else "no prefix caching"
    return f"{header['kv_layout']}, {window}, {retention}, {caching}"


def describe_connector(lines: list[dict[str, Any]]) -> str:
    """``NixlConnector (kv_consumer), recompute: 31 hits (31 async), 0 failed
    loads, 2 lost blocks, 0 held frees``: what a connector trace exercised, as printed
    after it is written."""
    header = lines[0]
    calls = [c for x in lines[1:] for c in x.get(CALLS, ())]
    hits = [c for c in calls if c[0] == "matched" and c[3]]
    loads = sum(1 for c in hits if c[4])
    held = sum(1 for c in calls if c[0] == "finished" and c[3])
    reports = [x[REPORT] for x in lines[1:] if x.get(REPORT)]
    failed = sum(len(r.get("failed_recving", ())) for r in reports)
    lost = sum(len(r.get("invalid_block_ids", ())) for r in reports)
    policy = header["config"][CONNECTOR]["kv_load_failure_policy"]
    return (
        f"{header['kv_connector_name']}, {policy}: {len(hits)} hits ({loads} async),"
        f" {failed} failed loads, {lost} lost blocks, {held} held frees"
    )


def accepted(lines: list[dict[str, Any]]) -> str:
    """``A of D``: draft tokens accepted of those verified, over a trace."""
    stats = [x["spec_decoding_stats"] for x in lines[1:] if x.get("spec_decoding_stats")]
    a = sum(s["num_accepted_tokens"] for s in stats)
    return f"{a} of {sum(s['num_draft_tokens'] for s in stats)}"


if __name__ == "__main__":
    sys.exit(main())
