"""The model runner: from a step's scheduler columns to one sampled token per
sampling row, or, for a row carrying drafts (speculative decoding), the
drafts it accepts and the token after them, verified in the same forward.

Per-request state lives in arrays indexed by the scheduler's request slot
(its stable row while it lives): the known tokens, the block table and the
prompt length. A step's inputs are gathered from them with NumPy indexing
(input ids at ``[slot, position]``, block-table rows), and sampled tokens are
written back the same way, so nothing loops over requests on the way in;
only new requests and rows whose table grew are touched one by one.

Decode steps (one token per row, no drafts) take the graph-ready static
path (``static_decode``: padded, on preallocated buffers, replayed as a CUDA
graph on CUDA) unless ``enforce_eager``; every other step runs eagerly."""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from ironbatch.attention.backend import BACKENDS, AttentionMetadata
from ironbatch.engine.runner_output import RunnerOutput
from ironbatch.model import kv_cache
from ironbatch.model.config import ModelConfig
from ironbatch.model.llama import LlamaForCausalLM
from ironbatch.model.rejection_sampler import Verified, accept_greedy, verify_rows
from ironbatch.model.sampler import RowParams
from ironbatch.model.static_decode import StaticDecode
from ironbatch.model.step_sampler import StepSampler
from ironbatch.sampling_params import SamplingParams
from ironbatch.scheduler_output import Kind, SchedulerOutput


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        config: ModelConfig,
        *,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        dtype: torch.dtype,
        device: torch.device,
        attention_backend: str,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enforce_eager: bool = False,
        seed: int = 0,
    ) -> None:
        if attention_backend not in BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {sorted(BACKENDS)}, got {attention_backend!r}"
            )
        self.model, self.config, self.device = model, config, device
        self.block_size, self.max_model_len = block_size, max_model_len
        self.max_blocks = -(-max_model_len // block_size)
        # One block past the scheduler's: padding rows of static decode steps
        # write their K/V there, and no sequence ever reads it.
        k, v = kv_cache.allocate(config, num_blocks + 1, block_size, dtype, device)
        self.scratch_block = num_blocks
        self.attn = BACKENDS[attention_backend](
            k,
            v,
            1.0 / math.sqrt(config.head_dim),
            num_q_heads=config.num_heads,
            max_num_tokens=max(max_num_batched_tokens, max_num_seqs),
        )
        if attention_backend == "triton":
            model.use_triton_kernels(max_positions=max_model_len)
        self.tokens = np.zeros((0, max_model_len + 1), dtype=np.int64)
        self.tables = np.zeros((0, self.max_blocks), dtype=np.int32)
        self.table_lens = np.zeros(0, dtype=np.int32)
        self.prompt_lens = np.zeros(0, dtype=np.int32)
        self.sampler = StepSampler(device, max_rows=max_num_seqs, seed=seed)
        # Seconds spent per phase, summed over steps (see benches/engine_overhead.py).
        self.timings = {"prepare": 0.0, "forward": 0.0, "sample": 0.0}
        # Wait for the device after the forward so "forward" holds its device
        # time, not only its launches (for a breakdown; costs a stall a step).
        self.sync_for_timings = False
        self.static_decode = None  # enforce_eager: every step eager
        if not enforce_eager:  # last: on CUDA this captures the decode graphs
            self.static_decode = StaticDecode(
                model,
                self.attn,
                max_num_seqs=max_num_seqs,
                max_blocks=self.max_blocks,
                scratch_slots=num_blocks * block_size + np.arange(max_num_seqs) % block_size,
                hidden_size=config.hidden_size,
                dtype=dtype,
                device=device,
            )

    def _grow(self, slot: int) -> None:
        if slot < len(self.table_lens):
            return
        n = max(slot + 1, 2 * len(self.table_lens), 16)
        for name in ("tokens", "tables", "table_lens", "prompt_lens"):
            old = getattr(self, name)
            new = np.zeros((n, *old.shape[1:]), dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)
        self.sampler.grow(n)

    def begin_request(self, slot: int, prompt: list[int], params: SamplingParams) -> None:
        """A request scheduled for the first time in ``slot``. Its tokens and
        parameters are in place before its generator is made, so if that
        fails, this step still computes the request's own KV."""
        self._grow(slot)
        self.tokens[slot, : len(prompt)] = prompt
        self.prompt_lens[slot] = len(prompt)
        self.sampler.begin_request(slot, params)

    def _update_tables(self, out: SchedulerOutput) -> None:
        if out.num_kv_cache_groups != 1:
            # Its attention reads one block table per request: full attention.
            raise ValueError(
                "the model runner computes full attention over one KV-cache group; this step "
                f"has {out.num_kv_cache_groups} (CacheConfig.kv_cache_groups)"
            )
        offsets = out.new_block_offsets
        grew = np.flatnonzero(offsets[1:] > offsets[:-1]).tolist()
        for i in grew:
            slot = int(out.req_slots[i])
            ids = out.new_block_ids[offsets[i] : offsets[i + 1]]
            start = 0 if out.kinds[i] != Kind.RUNNING else int(self.table_lens[slot])
            self.tables[slot, start : start + len(ids)] = ids
            self.table_lens[slot] = start + len(ids)
        for i in np.flatnonzero(out.kinds != Kind.RUNNING).tolist():  # new/resumed, hit-only table
            if offsets[i + 1] == offsets[i]:
                self.table_lens[int(out.req_slots[i])] = 0

    def known_tokens(self, slot: int, length: int) -> np.ndarray:
        """The first ``length`` tokens of the request in ``slot`` (a view)."""
        return self.tokens[slot, :length]

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, eos_token_ids: tuple[int, ...]) -> RunnerOutput:
        """Run the step: one token per scheduled row (-1 where the step does
        not reach the request's last known token, or its sampling failed);
        if the step carries drafts, each row's accepted drafts and the token
        after them instead (``RunnerOutput.token_offsets``). A failure of
        the whole step (the forward) raises."""
        n = len(out.req_ids)
        result = RunnerOutput(np.full(n, -1, dtype=np.int64))
        if n == 0:
            return result
        t0 = time.perf_counter()
        self._update_tables(out)
        slots = out.req_slots.astype(np.int64)
        has_drafts = len(out.spec_token_ids) > 0
        static = self.static_decode
        if static is not None and static.serves(out):
            t1 = time.perf_counter()
            hidden = static.run(
                input_ids=self.tokens[slots, out.positions],
                positions=out.positions,
                slot_mapping=out.slot_mapping,
                seq_lens=out.seq_lens,
                block_table=self.tables[slots],
            )
        else:
            hidden, t1 = self._eager_forward(out, slots, has_drafts)
        which = np.flatnonzero(out.samples)
        if len(which) == 0:
            self._clock(t0, t1, time.perf_counter(), None)
            return result
        if has_drafts:
            t2 = self._verify(out, hidden, which, eos_token_ids, result)
            self._clock(t0, t1, t2, time.perf_counter())
            return result
        last_rows = out.query_start_loc[1:][which] - 1
        if last_rows[-1] == len(last_rows) - 1:  # rows 0, 1, ...: decode steps
            logits = self.model.logits(hidden[: len(last_rows)])
        else:
            logits = self.model.logits(hidden[torch.from_numpy(last_rows).to(self.device).long()])
        if self.sync_for_timings and logits.is_cuda:
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        rows_slots = slots[which]
        seq_lens = out.seq_lens[which]
        drawn = self.sampler.sample(
            logits,
            rows_slots,
            seq_lens - self.prompt_lens[rows_slots],
            lambda j: self._row(int(rows_slots[j]), int(seq_lens[j]), eos_token_ids),
        )
        tokens_np = drawn.tokens
        if drawn.logprobs is not None:
            result.logprobs = (which[drawn.logprobs[0]], drawn.logprobs[1])
        result.errors = {int(which[j]): reason for j, reason in drawn.errors.items()}
        result.sampled[which] = tokens_np
        ok = tokens_np >= 0
        self.tokens[rows_slots[ok], seq_lens[ok]] = tokens_np[ok]  # where the next token goes
        self._clock(t0, t1, t2, time.perf_counter())
        return result

    def _eager_forward(
        self, out: SchedulerOutput, slots: np.ndarray, has_drafts: bool
    ) -> tuple[torch.Tensor, float]:
        """The step's hidden states, its inputs made for it; and when the
        inputs were ready."""
        rows = np.repeat(slots, out.num_scheduled)
        if has_drafts:
            self._write_drafts(out, rows)
        input_ids = torch.from_numpy(self.tokens[rows, out.positions]).to(self.device)
        positions = torch.from_numpy(out.positions).to(self.device)
        q_lens = out.num_scheduled.tolist()
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(out.slot_mapping).to(self.device),
            query_start_loc=torch.from_numpy(out.query_start_loc).to(self.device),
            seq_lens=torch.from_numpy(out.seq_lens).to(self.device),
            block_table=torch.from_numpy(self.tables[slots]).to(self.device),
            max_seqlen_q=max(q_lens),
            query_lens=q_lens,
            seq_lens_host=out.seq_lens.tolist(),
        )
        t1 = time.perf_counter()
        self.attn.begin_step(meta)
        return self.model(input_ids, positions, self.attn), t1

    def _write_drafts(self, out: SchedulerOutput, rows: np.ndarray) -> None:
        """Put the step's drafts where its input ids are read: they are each
        row's last ``num_spec_tokens`` scheduled tokens. A placeholder (-1)
        becomes token 0; its KV is computed and then rejected."""
        scheduled = out.num_scheduled
        first_draft = np.repeat(out.query_start_loc[1:] - out.num_spec_tokens, scheduled)
        is_draft = np.arange(len(rows)) >= first_draft
        drafts = np.maximum(out.spec_token_ids.astype(np.int64), 0)
        self.tokens[rows[is_draft], out.positions[is_draft]] = drafts

    def _verify(
        self,
        out: SchedulerOutput,
        hidden: torch.Tensor,
        which: np.ndarray,
        eos_token_ids: tuple[int, ...],
        result: RunnerOutput,
    ) -> float:
        """Logits at each sampling row's last ``1 + drafts`` positions, the
        drafts verified against them (``rejection_sampler``), the emitted
        tokens written back and into ``result``; returns when the forward
        was done."""
        n = len(out.req_ids)
        d = out.num_spec_tokens[which].astype(np.int64)
        m = d + 1
        ends = out.query_start_loc[1:][which].astype(np.int64)
        logit_rows = np.repeat(ends - m, m) + _local(m)
        logits = self.model.logits(hidden[torch.from_numpy(logit_rows).to(self.device)])
        if self.sync_for_timings and logits.is_cuda:
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        draft_rows = np.repeat(np.arange(n), out.num_spec_tokens)
        drafts = out.spec_token_ids.astype(np.int64)[out.samples[draft_rows].astype(bool)]
        rows_slots = out.req_slots[which].astype(np.int64)
        base = (out.seq_lens[which] - d).astype(np.int64)  # known tokens before the step
        verified: Verified
        if self.sampler.all_plain(rows_slots, base - self.prompt_lens[rows_slots]):
            verified = accept_greedy(logits.argmax(-1).cpu().numpy(), drafts, d)
        else:
            row_params = [
                self._row(int(sl), int(b), eos_token_ids)
                for sl, b in zip(rows_slots, base, strict=True)
            ]
            per_row = [r.tolist() for r in np.split(drafts, np.cumsum(d)[:-1])]
            verified = verify_rows(logits, row_params, per_row, self.sampler.generator)
            keep = _local(m) < np.repeat(verified.counts, m)
            logprobs = logits.log_softmax(-1)[torch.from_numpy(keep).to(self.device)]
            result.logprobs = (np.repeat(which, verified.counts), logprobs)
            result.errors = {int(which[j]): reason for j, reason in verified.errors.items()}
        counts = np.zeros(n, dtype=np.int64)
        counts[which] = verified.counts
        result.token_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=result.token_offsets[1:])
        result.sampled = verified.tokens
        positions = np.repeat(base, verified.counts) + _local(verified.counts)
        self.tokens[np.repeat(rows_slots, verified.counts), positions] = verified.tokens
        return t2

    def _clock(self, t0: float, t1: float, t2: float, t3: float | None) -> None:
        self.timings["prepare"] += t1 - t0
        self.timings["forward"] += t2 - t1
        if t3 is not None:
            self.timings["sample"] += t3 - t2

    def _row(self, slot: int, seq_len: int, eos: tuple[int, ...]) -> RowParams:
        params, gen = self.sampler.params[slot]
        prompt_len = int(self.prompt_lens[slot])
        toks = self.tokens[slot]
        return RowParams(
            params=params,
            prompt=torch.from_numpy(toks[:prompt_len]).to(self.device),
            output=torch.from_numpy(toks[prompt_len:seq_len]).to(self.device),
            eos_token_ids=eos,
            generator=gen,
        )


def _local(counts: np.ndarray) -> np.ndarray:
    """0, 1, ... within each of consecutive groups of ``counts`` items."""
    starts = np.cumsum(counts) - counts
    return np.arange(int(counts.sum())) - np.repeat(starts, counts)
