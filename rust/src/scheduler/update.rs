//! `update_from_output` (docs/scheduling.md §5): the tokens a step sampled
//! come back; each is appended and checked for a stop (and, for a
//! structured-output request, against its grammar), finished requests are
//! freed in scheduling order, and (async) placeholders are resolved.

use super::encoder_inputs::release_encoded;
use super::kv_load_failure::FailedLoads;
use super::request_errors::RequestErrors;
use super::Scheduler;
use crate::error::Error;
use crate::kv_cache_manager::KvCacheManager;
use crate::kv_connector::KvTransferReport;
use crate::request::{Request, RequestStatus};
use crate::scheduler_config::Runner;
use crate::slab::Slot;
use crate::spec_decode::SpecDecodingStats;
use crate::step::{Finished, StepEntry, StepOutput, UpdateOutput, UpdateRecord};
use crate::stop_check::check_stop;

/// The requests an update finished, by the queue each leaves.
#[derive(Default)]
pub(super) struct Ended {
    running: Vec<Slot>,
    waiting: Vec<Slot>,
    /// Streaming sessions whose turn ended: queued again, waiting.
    continuing: Vec<Slot>,
}

impl Scheduler {
    /// Apply a step's sampled tokens: entry `i` of `step` gets
    /// `tokens[offsets[i]..offsets[i + 1]]`. Checked first, so an `Err`
    /// changes nothing.
    pub fn update_from_output(
        &mut self,
        step: &StepOutput,
        tokens: &[u32],
        offsets: &[usize],
    ) -> Result<UpdateOutput, Error> {
        self.update_from_output_checked(step, tokens, offsets, &mut |_, _, _| true)
    }

    /// [`Self::update_from_output`], asking `accept(slot, request, kept)`
    /// about the tokens each structured-output request kept (appended
    /// already, after the stop check trimmed them; delivered stale output
    /// included). `false` ends the request with an error, whatever the stop
    /// check said (§5.2): its grammar rejected them.
    pub fn update_from_output_checked(
        &mut self,
        step: &StepOutput,
        tokens: &[u32],
        offsets: &[usize],
        accept: &mut dyn FnMut(Slot, &Request, &[u32]) -> bool,
    ) -> Result<UpdateOutput, Error> {
        let no_report = KvTransferReport::default();
        self.update_with_kv_report(
            step,
            tokens,
            offsets,
            accept,
            &no_report,
            RequestErrors::none(),
        )
    }

    /// [`Self::update_from_output_checked`] with the worker's report of the
    /// step's KV transfers (§4.19), in vLLM's order: failed loads cut their
    /// requests back first (those scheduled in the step take no output),
    /// then the output is applied, then the requests the "fail" policy
    /// ends and those `errors` names finish with an error, in one order
    /// (see [`RequestErrors`]), then finished loads and sends are settled.
    pub fn update_with_kv_report(
        &mut self,
        step: &StepOutput,
        tokens: &[u32],
        offsets: &[usize],
        accept: &mut dyn FnMut(Slot, &Request, &[u32]) -> bool,
        report: &KvTransferReport,
        errors: RequestErrors<'_>,
    ) -> Result<UpdateOutput, Error> {
        self.check_update(step, tokens, offsets)?;
        if !report.is_empty() {
            self.check_kv_report(report)?;
        }
        let failed = self.take_failed_loads(step, report);
        self.pending_steps.retain(|&s| s != step.step_id);
        // Each scheduled request's last token, which the update appends after.
        self.read_ahead(step.entries.iter().map(|e| e.slot), |r| {
            r.seq.tokens().last().copied().unwrap_or(0) as usize
        });
        let mut out = UpdateOutput::default();
        // Sized once: grown by doubling, they reallocated ~10 times a step
        // at 1,024 running requests.
        out.records.reserve(step.entries.len());
        out.tokens.reserve(tokens.len());
        let mut ended = Ended::default();
        for (i, e) in step.entries.iter().enumerate() {
            if !self.is_live(e) {
                continue; // finished (and maybe its slot reused) meanwhile
            }
            if failed.skip.contains(&e.slot) {
                self.skip_cut_back(e);
                continue;
            }
            let sampled = &tokens[offsets[i]..offsets[i + 1]];
            if let Some(status_before) = self.apply_output(i, e, sampled, accept, &mut out) {
                self.end_request(e.slot, status_before, &mut out, &mut ended);
            }
        }
        self.unqueue_ended(ended);
        self.settle_kv_report(&mut out, failed, report, errors);
        Ok(out)
    }

    /// A step's entry whose request a failed load cut back: it takes no
    /// output, and computes again from there.
    pub(super) fn skip_cut_back(&mut self, e: &StepEntry) {
        let r = &mut self.requests[e.slot];
        r.in_flight_tokens = r.in_flight_tokens.saturating_sub(e.num_tokens);
        r.stale_tokens = r.stale_tokens.saturating_sub(e.num_tokens);
    }

    /// A step's KV-transfer report (checked), before its output: the step's
    /// writes are done, so fenced frees go back, and failed loads cut their
    /// requests back (those the update skips, those it ends).
    pub(super) fn take_failed_loads(
        &mut self,
        step: &StepOutput,
        report: &KvTransferReport,
    ) -> FailedLoads {
        self.apply_pin_requests();
        if self.kv_setup.defer_block_free && step.entries.iter().any(|e| e.num_tokens > 0) {
            // Every write of this step and those before it is done.
            self.processed_step_seq += 1;
            self.drain_deferred_frees();
        }
        if report.failed_recving.is_empty() && report.invalid_block_ids.is_empty() {
            FailedLoads::default()
        } else {
            self.apply_failed_loads(report, step)
        }
    }

    /// A step's KV-transfer report, after its output: the requests the
    /// "fail" policy ends and the caller's errors finish with an error,
    /// then finished loads and sends are settled.
    pub(super) fn settle_kv_report(
        &mut self,
        out: &mut UpdateOutput,
        failed: FailedLoads,
        report: &KvTransferReport,
        errors: RequestErrors<'_>,
    ) {
        self.end_with_errors(out, failed, errors);
        if !(report.finished_recving.is_empty() && report.finished_sending.is_empty()) {
            self.settle_kv_transfers(&report.finished_recving, &report.finished_sending);
        }
    }

    /// The request in `slot` finished in this update (its record is the
    /// last of `out.finished`): a session's turn ends, anything else is
    /// freed now, in scheduling order, which shapes the free queue (Q18).
    pub(super) fn end_request(
        &mut self,
        slot: Slot,
        status_before: RequestStatus,
        out: &mut UpdateOutput,
        ended: &mut Ended,
    ) {
        if status_before == RequestStatus::Running {
            ended.running.push(slot);
        } else {
            ended.waiting.push(slot);
        }
        let was_resumable = self.requests[slot].resumable;
        let continues = self.end_turn(slot);
        // A KV connector is shown the request as it finishes, tokens and all.
        let has_connector = self.connector.is_some();
        if let Some(f) = out.finished.last_mut() {
            let r = &mut self.requests[slot];
            // A session's turn end resets what it computed to its frontier.
            f.num_computed_tokens = r.seq.num_computed_tokens;
            f.session_continues = continues;
            if !was_resumable {
                // Freed below: its tokens move instead of being copied.
                f.token_ids = if has_connector {
                    r.seq.tokens().to_vec()
                } else {
                    r.seq.take_tokens()
                };
            }
        }
        if continues {
            // A streaming session: it waits for (or took) its next chunk.
            ended.continuing.push(slot);
        } else {
            self.free_request(slot, false);
        }
    }

    /// Out of their queues at once, as vLLM takes them out; sessions that
    /// go on are queued again, waiting.
    pub(super) fn unqueue_ended(&mut self, ended: Ended) {
        if !ended.running.is_empty() {
            self.running.retain(|s| !ended.running.contains(s));
        }
        self.unqueue_waiting(&ended.waiting);
        for &slot in &ended.continuing {
            if ended.waiting.contains(&slot) {
                self.undefer(slot);
            }
            self.enqueue_waiting(slot);
        }
    }

    /// Apply entry `row`'s tokens to its request and record them in `out`.
    /// Returns the request's status before, if it finished (the caller
    /// frees it).
    fn apply_output(
        &mut self,
        row: usize,
        e: &StepEntry,
        sampled: &[u32],
        accept: &mut dyn FnMut(Slot, &Request, &[u32]) -> bool,
        out: &mut UpdateOutput,
    ) -> Option<RequestStatus> {
        let max_len = self.config.max_model_len;
        let num_spec_tokens = self.config.num_speculative_tokens;
        let kv = &mut self.kv;
        let r = &mut self.requests[e.slot];
        r.in_flight_tokens = r.in_flight_tokens.saturating_sub(e.num_tokens);
        let stale = r.stale_tokens > 0;
        if stale {
            r.stale_tokens = r.stale_tokens.saturating_sub(e.num_tokens);
            if r.drop_stale {
                return None; // a reset preempted it: discarded (§5.4)
            }
        }
        if sampled.is_empty() {
            release_encoded(&mut self.encoder, &mut self.ec_connector, e.slot, r);
            // An encoder-only deployment samples nothing: a request is done
            // once its prompt is consumed (its images encoded, §4.18).
            let consumed = r.seq.num_computed_tokens >= r.seq.num_prompt_tokens();
            if self.config.runner == Runner::EncoderOnly && consumed {
                return Some(finish_without_tokens(kv, row, e.slot, r, out));
            }
            return None; // a prefill chunk: no output
        }
        let num_drafts = e.drafts.len();
        if num_drafts > 0 {
            // Positions of rejected drafts are computed again; a stale
            // output's counts predate the preemption and are left alone.
            let accepted = sampled.len() - 1;
            let rejected = num_drafts - accepted;
            if !stale {
                r.seq.num_computed_tokens = r.seq.num_computed_tokens.saturating_sub(rejected);
                r.num_output_placeholders = r.num_output_placeholders.saturating_sub(rejected);
            }
            out.spec_decoding_stats
                .get_or_insert_with(|| SpecDecodingStats::new(num_spec_tokens))
                .observe(num_drafts, accepted);
        }
        release_encoded(&mut self.encoder, &mut self.ec_connector, e.slot, r);
        let status_before = r.status;
        let had_placeholders = r.num_output_placeholders > 0;
        let start = out.tokens.len();
        let mut finished = append_until_stop(r, sampled, kv, max_len, &mut out.tokens);
        if finished && !stale {
            // Positions scheduled for tokens after the stop were for nothing.
            let unused = sampled.len() - (out.tokens.len() - start);
            r.seq.num_computed_tokens -= unused.min(r.seq.num_computed_tokens);
        }
        if !stale && had_placeholders {
            // Every returned token resolves a placeholder, kept or trimmed.
            r.num_output_placeholders = r.num_output_placeholders.saturating_sub(sampled.len());
        }
        let confirms_blocks = had_placeholders || num_spec_tokens > 0;
        if !stale && status_before == RequestStatus::Running && confirms_blocks {
            cache_arrived(kv, e.slot, r);
        }
        if r.grammar.is_some() && !accept(e.slot, r, &out.tokens[start..]) {
            r.status = RequestStatus::FinishedError; // the grammar rejected them
            r.resumable = false; // which ends a session too
            finished = true;
        }
        out.records.push(UpdateRecord {
            entry: row as u32,
            slot: e.slot,
            tokens_end: out.tokens.len(),
            cached_tokens: kv.num_cached_tokens(&r.tables),
        });
        if !finished {
            return None;
        }
        out.finished.push(Finished {
            record: out.records.len() - 1,
            request_id: r.request_id.clone(),
            status: r.status,
            stop_reason: r.stop_reason,
            // A session's turn may go on and change its tokens: copied as
            // they ended. A request that ends gives its own up when freed.
            token_ids: if r.resumable {
                r.seq.tokens().to_vec()
            } else {
                Vec::new()
            },
            num_computed_tokens: r.seq.num_computed_tokens,
            session_continues: false,
        });
        Some(status_before)
    }

    /// The whole output must fit the step before anything changes.
    fn check_update(
        &self,
        step: &StepOutput,
        tokens: &[u32],
        offsets: &[usize],
    ) -> Result<(), Error> {
        if step.scheduler_id != self.id {
            return Err(Error::ForeignStep);
        }
        if !self.pending_steps.contains(&step.step_id) {
            return Err(Error::StepAlreadyApplied);
        }
        if self.config.runner == Runner::Pooling && !tokens.is_empty() {
            return Err(Error::invalid(
                "sampled: a pooling runner samples no tokens; apply its output with \
                 update_from_pooler_output",
            ));
        }
        if self.config.runner == Runner::EncoderOnly && !tokens.is_empty() {
            return Err(Error::invalid(
                "sampled: an encoder-only runner samples no tokens (runner='encoder_only')",
            ));
        }
        let n = step.entries.len();
        if offsets.len() != n + 1 {
            return Err(Error::invalid(format!(
                "sampled: {} offsets for a step of {n} requests (need {})",
                offsets.len(),
                n + 1
            )));
        }
        let rising = offsets.windows(2).all(|w| w[0] <= w[1]);
        if offsets[0] != 0 || !rising || offsets[n] != tokens.len() {
            return Err(Error::invalid(
                "sampled: offsets must rise from 0 to the number of tokens",
            ));
        }
        for (i, e) in step.entries.iter().enumerate() {
            let got = offsets[i + 1] - offsets[i];
            // A step samples one token after the drafts it verified: a
            // runner handing back more would grow the request by tokens no
            // step computed.
            if got > e.drafts.len() + 1 {
                return Err(Error::invalid(format!(
                    "sampled: entry {i} got {got} tokens, but its step scheduled {} drafts, \
                     so it samples at most {}",
                    e.drafts.len(),
                    e.drafts.len() + 1
                )));
            }
            if got > 0 && !e.samples {
                return Err(Error::invalid(format!(
                    "sampled: entry {i} got tokens, but its step ended before the request's \
                     last known token"
                )));
            }
        }
        Ok(())
    }
}

/// End request `r` (in `slot`, entry `row` of the step) with a result
/// that carries no token: a pooled output, or an encoder-only
/// deployment's consumed prompt (`FINISHED_STOPPED`). Returns its status
/// before, for the caller to free it.
pub(super) fn finish_without_tokens(
    kv: &KvCacheManager,
    row: usize,
    slot: Slot,
    r: &mut Request,
    out: &mut UpdateOutput,
) -> RequestStatus {
    let status_before = r.status;
    r.status = RequestStatus::FinishedStopped;
    out.records.push(UpdateRecord {
        entry: row as u32,
        slot,
        tokens_end: out.tokens.len(),
        cached_tokens: kv.num_cached_tokens(&r.tables),
    });
    out.finished.push(Finished {
        record: out.records.len() - 1,
        request_id: r.request_id.clone(),
        status: r.status,
        stop_reason: None,
        token_ids: Vec::new(),
        num_computed_tokens: r.seq.num_computed_tokens,
        session_continues: false,
    });
    status_before
}

/// Append `sampled` to `r` one token at a time, stopping after the first
/// token that ends it (docs/scheduling.md §5.2); the appended tokens go to
/// `out` too. Returns whether it finished.
fn append_until_stop(
    r: &mut Request,
    sampled: &[u32],
    kv: &KvCacheManager,
    max_model_len: usize,
    out: &mut Vec<u32>,
) -> bool {
    for &t in sampled {
        r.seq.append(&[t], kv.hasher(), kv.hash_block_size());
        out.push(t);
        if check_stop(r, max_model_len) {
            return true;
        }
    }
    false
}

/// Hash-cache the blocks of a running request that arrived tokens
/// confirmed: under async scheduling (the tokens were placeholders at
/// allocation) and speculative decoding (only accepted drafts count), vLLM
/// caches them when the output arrives.
fn cache_arrived(kv: &mut KvCacheManager, slot: Slot, r: &mut Request) {
    let upto = r.seq.num_computed_tokens.saturating_sub(r.in_flight_tokens);
    kv.cache_full_blocks(&mut r.tables, &r.seq, upto, slot);
}
