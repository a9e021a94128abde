//! The scheduler's side of a KV connector (docs/scheduling.md §4.19): the
//! question at admission, loads that arrive over later steps
//! (`WaitingForRemoteKvs`), blocks a finished request keeps while the
//! connector sends them, and the transfers the worker reports back.

use super::{DeferredFree, Scheduler};
use crate::block::BlockId;
use crate::cdiv;
use crate::error::Error;
use crate::kv_connector::{ExternalHit, KvConnector, KvConnectorSetup, RequestState};
use crate::request::{Request, RequestStatus};
use crate::scheduler_config::Runner;
use crate::slab::Slot;

/// The connector's answer for an admission.
pub(super) enum Answer {
    /// There is no connector to ask.
    NoConnector,
    /// "Ask again later" (or an answer that breaks the contract): the
    /// request is skipped this step.
    Later,
    Hit(ExternalHit),
}

impl Scheduler {
    /// Attach a KV connector; before any request, and only where the core
    /// follows vLLM with one: KV-cache groups of attention with per-token
    /// blocks (no cross-attention) and recurrent states, a generating or
    /// pooling runner.
    pub fn set_kv_connector(
        &mut self,
        connector: Box<dyn KvConnector>,
        setup: KvConnectorSetup,
    ) -> Result<(), Error> {
        let c = &self.config;
        let why = if !self.ids.is_empty() {
            Some("it must be set before the first request")
        } else if c.cache.groups.is_empty() || c.cache.groups.iter().any(|g| g.kind.is_cross()) {
            // Full attention, windows and chunked local attention (vLLM
            // gives a connector without hybrid support one group of them).
            Some("kv_cache_groups must be attention or recurrent-state groups")
        } else if !matches!(c.runner, Runner::Generate | Runner::Pooling) {
            Some("runner must be 'generate' or 'pooling'")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Error::invalid(format!("kv_connector: {why}")));
        }
        self.connector = Some(connector);
        self.kv_setup = setup;
        // Cached states (cache mode "align") are offered to it (§4.19.2).
        self.kv.enable_boundary_states();
        Ok(())
    }

    /// Finished requests whose blocks stay for a KV connector (a send, or
    /// a load still on its way), in no order.
    pub fn kv_held(&self) -> impl Iterator<Item = Slot> + '_ {
        self.ids
            .values()
            .copied()
            .filter(|&slot| self.requests[slot].status.is_finished())
    }

    /// Blocks of freed requests set aside while a step in flight may still
    /// write them (fenced frees), oldest first.
    pub fn deferred_frees(&self) -> impl Iterator<Item = &DeferredFree> + '_ {
        self.deferred_frees.iter()
    }

    /// Whether a KV connector is attached.
    pub fn has_kv_connector(&self) -> bool {
        self.connector.is_some()
    }

    /// Ask the connector about the request in `slot`, `num_local` of whose
    /// tokens were hit locally (whole blocks).
    pub(super) fn ask_connector(&mut self, slot: Slot, num_local: usize) -> Answer {
        let Some(connector) = self.connector.as_mut() else {
            return Answer::NoConnector;
        };
        let r = &self.requests[slot];
        let num_tokens = r.num_tokens();
        let cached = self.kv.cached_positions(&r.tables);
        connector.observe_request(&state_of(r, r.seq.num_computed_tokens, r.status, &cached));
        let answer = connector.get_num_new_matched_tokens(&r.request_id, num_tokens, num_local);
        // A request that reads no cache takes no external hit either (the
        // connector was still asked, as vLLM asks it).
        if r.skip_reading_prefix_cache {
            return Answer::Hit(ExternalHit::NONE);
        }
        match answer {
            Some(hit) if hit.fits(num_tokens, num_local) => Answer::Hit(hit),
            _ => Answer::Later,
        }
    }

    /// The groups an asynchronous load of the request in `slot` writes, as
    /// the connector names them, as a bit set (bit `g`: group `g`).
    pub(super) fn connector_loaded_groups(&mut self, slot: Slot) -> u64 {
        let num_groups = self.config.cache.groups.len();
        let Some(connector) = self.connector.as_mut() else {
            return 0;
        };
        let groups = connector.loaded_groups(&self.requests[slot].request_id, num_groups);
        groups
            .iter()
            .filter(|&&g| g < num_groups)
            .fold(0, |bits, &g| bits | 1 << g)
    }

    /// Tell the connector the request's blocks after an admission; vLLM
    /// calls before it sets the request's computed count and status, so
    /// the connector sees `before` (computed tokens, status).
    pub(super) fn notify_after_alloc(
        &mut self,
        slot: Slot,
        num_external_tokens: usize,
        before: (usize, RequestStatus),
    ) {
        if let Some(connector) = self.connector.as_mut() {
            let r = &self.requests[slot];
            let cached = self.kv.cached_positions(&r.tables);
            connector.observe_request(&state_of(r, before.0, before.1, &cached));
            let block_ids: Vec<Vec<BlockId>> =
                r.tables.iter().map(|t| t.block_ids().to_vec()).collect();
            connector.update_state_after_alloc(&r.request_id, &block_ids, num_external_tokens);
            self.apply_pin_requests(); // the connector's pins, at once, as vLLM's
        }
    }

    /// Blocks an async load must leave free: what every in-flight prefill
    /// still needs for its whole sequence (and a draft step), plus one
    /// draft step's blocks of its own (vLLM's reservation).
    pub(super) fn reserved_for_inflight_prefills(&self) -> usize {
        let c = &self.config;
        let k = c.num_speculative_tokens;
        let spec = if k > 0 {
            1 + k + c.cache.num_lookahead_tokens
        } else {
            0
        };
        let reserved: usize = self
            .ids
            .values()
            .map(|&slot| &self.requests[slot])
            .filter(|r| r.inflight_prefill)
            .map(|r| {
                let tokens = r.num_tokens().min(c.max_model_len) + spec;
                self.kv.blocks_to_hold(&r.tables, tokens, &r.seq)
            })
            .sum();
        reserved + self.kv.draft_step_blocks(spec)
    }

    /// A loading request the waiting pass reached after its load was
    /// reported: its loaded blocks are cached (after a failure, those
    /// before the cut; with nothing left, its blocks go and it asks again),
    /// a load of every token gives the last back (to compute and sample
    /// from), and it waits as before.
    pub(super) fn settle_load(&mut self, slot: Slot) {
        let r = &mut self.requests[slot];
        let computed = r.seq.num_computed_tokens;
        if r.kv_load_failed && computed == 0 {
            // There may be a local hit when it asks again.
            self.kv.free(&mut r.tables);
        } else {
            self.kv
                .cache_full_blocks(&mut r.tables, &r.seq, computed, slot);
            if r.kv_load_failed {
                // What the load left unwritten is computed here: zeroed
                // first, where zeroing applies.
                self.kv.record_blocks_for_zeroing(&r.tables, computed);
            }
        }
        r.kv_load_failed = false;
        if computed == r.num_tokens() {
            r.seq.num_computed_tokens -= 1;
        }
        r.kv_loaded = false;
        r.status = if r.num_preemptions > 0 {
            RequestStatus::Preempted
        } else {
            RequestStatus::Waiting
        };
    }

    /// Tell the connector a request finished (its status set); true holds
    /// its blocks until the connector reports its send done.
    pub(super) fn connector_finished(&mut self, slot: Slot) -> bool {
        let Some(connector) = self.connector.as_mut() else {
            return false;
        };
        let r = &mut self.requests[slot];
        // A window's blocks out of reach go first (as far as the steps
        // that came back computed), then each attention group's blocks up
        // to the computed tokens are named, and a recurrent group's all
        // (its state blocks are no token range: vLLM clips attention only).
        let processed = r.seq.num_computed_tokens.saturating_sub(r.in_flight_tokens);
        self.kv
            .remove_blocks_out_of_window(&mut r.tables, processed);
        let computed = r.seq.num_computed_tokens;
        let block_ids: Vec<Vec<BlockId>> = r
            .tables
            .iter()
            .enumerate()
            .map(|(g, t)| {
                let n = if self.kv.groups()[g].kind.is_recurrent() {
                    t.len()
                } else {
                    cdiv(computed, self.kv.group_block_size(g))
                };
                t.block_ids()[..n.min(t.len())].to_vec()
            })
            .collect();
        let r = &self.requests[slot];
        let cached = self.kv.cached_positions(&r.tables);
        connector.observe_request(&state_of(r, r.seq.num_computed_tokens, r.status, &cached));
        let held = connector.request_finished(&r.request_id, &block_ids, r.status.name());
        self.apply_pin_requests(); // before the request's own blocks go, as vLLM's
        held
    }

    /// Whether the connector says blocks are about to come back.
    pub(super) fn connector_frees_pending(&mut self) -> bool {
        self.connector
            .as_mut()
            .is_some_and(|c| c.has_pending_block_frees())
    }

    /// The transfers a report names, checked: a load done must be of a
    /// request loading (or finished meanwhile), a send done of a finished
    /// one. Unknown ids, and ids in no such state, are refused with
    /// nothing changed. Returns the slots (loaded, sent), each once.
    pub(super) fn check_kv_transfers<S: AsRef<str>>(
        &self,
        finished_recving: &[S],
        finished_sending: &[S],
    ) -> Result<(Vec<Slot>, Vec<Slot>), Error> {
        let slot_of = |id: &str, what: &str| -> Result<Slot, Error> {
            self.ids.get(id).copied().ok_or_else(|| {
                Error::invalid(format!("{what}: request {id:?} is not a live request"))
            })
        };
        let mut loaded = Vec::new();
        for id in finished_recving {
            let slot = slot_of(id.as_ref(), "finished_recving")?;
            let r = &self.requests[slot];
            let loading = r.status == RequestStatus::WaitingForRemoteKvs;
            if !(loading || r.status.is_finished()) {
                return Err(Error::invalid(format!(
                    "finished_recving: request {:?} is not loading (status {})",
                    id.as_ref(),
                    r.status.name()
                )));
            }
            if !loaded.contains(&slot) {
                loaded.push(slot);
            }
        }
        let mut sent = Vec::new();
        for id in finished_sending {
            let slot = slot_of(id.as_ref(), "finished_sending")?;
            if !self.requests[slot].status.is_finished() {
                return Err(Error::invalid(format!(
                    "finished_sending: request {:?} has not finished",
                    id.as_ref()
                )));
            }
            if !sent.contains(&slot) && !loaded.contains(&slot) {
                sent.push(slot);
            }
        }
        Ok((loaded, sent))
    }

    /// The worker's report of finished transfers (vLLM's
    /// `finished_recving`, then `finished_sending`), checked by
    /// [`Self::check_kv_transfers`] before the update began: a loading
    /// request is ready for the next waiting pass, one that finished while
    /// loading lets its blocks go; a sent request lets its blocks go. (An
    /// id the update itself let go meanwhile is passed over.)
    pub(super) fn settle_kv_transfers(
        &mut self,
        finished_recving: &[String],
        finished_sending: &[String],
    ) {
        for id in finished_recving {
            let Some(&slot) = self.ids.get(id.as_str()) else {
                continue;
            };
            let r = &mut self.requests[slot];
            if r.status.is_finished() {
                self.release_request(slot);
            } else if r.status == RequestStatus::WaitingForRemoteKvs {
                r.kv_loaded = true;
            }
        }
        for id in finished_sending {
            if let Some(&slot) = self.ids.get(id.as_str()) {
                if self.requests[slot].status.is_finished() {
                    self.release_request(slot);
                }
            }
        }
    }
}

/// `r` as a connector call shows it, with `num_computed_tokens` and
/// `status` as vLLM's scheduler has them at that call.
fn state_of<'a>(
    r: &'a Request,
    num_computed_tokens: usize,
    status: RequestStatus,
    cached_blocks: &'a [Vec<u32>],
) -> RequestState<'a> {
    RequestState {
        request_id: &r.request_id,
        token_ids: r.seq.tokens(),
        num_computed_tokens,
        status: status.name(),
        cached_blocks,
    }
}
