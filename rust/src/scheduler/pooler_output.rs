//! A pooling runner's output (docs/scheduling.md §4.16): no tokens come
//! back, only a pooled result for each request whose step reached the end
//! of its prompt. That result finishes the request (`FINISHED_STOPPED`),
//! as vLLM's `update_from_output` ends a pooling request as soon as its
//! `pooler_output` arrives; a step that ended inside the prompt (a chunk)
//! brings nothing and the request runs on.

use super::encoder_inputs::release_encoded;
use super::request_errors::RequestErrors;
use super::update::{finish_without_tokens, Ended};
use super::Scheduler;
use crate::error::Error;
use crate::kv_connector::KvTransferReport;
use crate::request::RequestStatus;
use crate::scheduler_config::Runner;
use crate::step::{StepEntry, StepOutput, UpdateOutput};

impl Scheduler {
    /// Apply a pooling runner's output: `pooled[i]` says whether entry `i`
    /// of `step` got a pooled result. Checked first, so an `Err` changes
    /// nothing.
    pub fn update_from_pooler_output(
        &mut self,
        step: &StepOutput,
        pooled: &[bool],
    ) -> Result<UpdateOutput, Error> {
        self.update_pooled_with_kv_report(
            step,
            pooled,
            &KvTransferReport::default(),
            RequestErrors::none(),
        )
    }

    /// [`Self::update_from_pooler_output`] with the worker's report of the
    /// step's KV transfers, in the order a generating update takes it
    /// (`update_with_kv_report`), with the caller's `errors` as it takes
    /// them: a request a failed load cut back gets no pooled result from
    /// this step.
    pub fn update_pooled_with_kv_report(
        &mut self,
        step: &StepOutput,
        pooled: &[bool],
        report: &KvTransferReport,
        errors: RequestErrors<'_>,
    ) -> Result<UpdateOutput, Error> {
        self.check_pooled(step, pooled)?;
        if !report.is_empty() {
            self.check_kv_report(report)?;
        }
        let failed = self.take_failed_loads(step, report);
        self.pending_steps.retain(|&s| s != step.step_id);
        let mut out = UpdateOutput::default();
        let mut ended = Ended::default();
        for (i, e) in step.entries.iter().enumerate() {
            if !self.is_live(e) {
                continue; // finished (and maybe its slot reused) meanwhile
            }
            if failed.skip.contains(&e.slot) {
                self.skip_cut_back(e);
                continue;
            }
            if let Some(status_before) = self.apply_pooled(i, e, pooled[i], &mut out) {
                self.end_request(e.slot, status_before, &mut out, &mut ended);
            }
        }
        self.unqueue_ended(ended);
        self.settle_kv_report(&mut out, failed, report, errors);
        Ok(out)
    }

    /// Entry `row`'s result: a pooled one finishes its request (returns
    /// its status before, for the caller to free it).
    fn apply_pooled(
        &mut self,
        row: usize,
        e: &StepEntry,
        pooled: bool,
        out: &mut UpdateOutput,
    ) -> Option<RequestStatus> {
        let r = &mut self.requests[e.slot];
        r.in_flight_tokens = r.in_flight_tokens.saturating_sub(e.num_tokens);
        if r.stale_tokens > 0 {
            r.stale_tokens = r.stale_tokens.saturating_sub(e.num_tokens);
            if r.drop_stale {
                return None; // a reset preempted it: discarded (§5.4)
            }
        }
        // The step ran, so its encoder inputs are released either way.
        release_encoded(&mut self.encoder, &mut self.ec_connector, e.slot, r);
        if !pooled {
            return None; // a prefill chunk: no output
        }
        Some(finish_without_tokens(&self.kv, row, e.slot, r, out))
    }

    /// The whole pooled output must fit the step before anything changes.
    fn check_pooled(&self, step: &StepOutput, pooled: &[bool]) -> Result<(), Error> {
        if self.config.runner != Runner::Pooling {
            return Err(Error::invalid(
                "pooler_output: this scheduler's runner generates (runner='generate'); apply \
                 its sampled tokens with update_from_output",
            ));
        }
        if step.scheduler_id != self.id {
            return Err(Error::ForeignStep);
        }
        if !self.pending_steps.contains(&step.step_id) {
            return Err(Error::StepAlreadyApplied);
        }
        let n = step.entries.len();
        if pooled.len() != n {
            return Err(Error::invalid(format!(
                "pooler_output: {} entries for a step of {n} requests",
                pooled.len()
            )));
        }
        // A runner pools a prompt once its last position is computed: a
        // result for a step that ended inside the prompt would finish a
        // request whose prompt was never read to the end.
        if let Some(i) = (0..n).find(|&i| pooled[i] && !step.entries[i].samples) {
            return Err(Error::invalid(format!(
                "pooler_output: entry {i} got a pooled result, but its step ended before the \
                 end of the request's prompt"
            )));
        }
        Ok(())
    }
}
