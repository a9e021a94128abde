//! The scheduler's side of an encoder-cache connector (docs/scheduling.md
//! §4.20): attaching one, and the calls the passes make into it.

use super::{EncoderStore, Scheduler};
use crate::ec_connector::EcConnector;
use crate::error::Error;
use crate::multimodal::MultimodalInput;
use crate::slab::Slot;

impl Scheduler {
    /// Attach an encoder-cache connector, before the first request. Only a
    /// scheduler whose encoder outputs are shared by identifier (a vision
    /// or audio decoder) takes one: an encoder-decoder's encoder runs per
    /// request.
    pub fn set_ec_connector(&mut self, connector: Box<dyn EcConnector>) -> Result<(), Error> {
        let why = if !self.ids.is_empty() {
            Some("it must be set before the first request")
        } else if !matches!(self.encoder, EncoderStore::Shared(_)) || self.config.encoder.is_none()
        {
            Some("the scheduler needs an encoder whose outputs are shared by identifier")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Error::invalid(format!("ec_connector: {why}")));
        }
        self.ec_connector = Some(connector);
        Ok(())
    }

    /// Whether an encoder output the request in `slot` needs past
    /// `num_computed_tokens` is still in transit (vLLM's
    /// `_ec_transfer_pending`): then it waits this step. Asked only of
    /// requests with encoder inputs.
    pub(super) fn ec_transfer_pending(&mut self, slot: Slot, num_computed_tokens: i64) -> bool {
        let Some(connector) = self.ec_connector.as_mut() else {
            return false;
        };
        let r = &self.requests[slot];
        !r.mm_inputs.is_empty()
            && !connector.ensure_cache_available(&r.request_id, num_computed_tokens)
    }

    /// Tell the encoder-cache connector a request finished; true holds its
    /// KV blocks (§4.19's hold, which a KV connector's report releases).
    pub(super) fn ec_finished(&mut self, slot: Slot) -> bool {
        match self.ec_connector.as_mut() {
            Some(connector) => connector.request_finished(&self.requests[slot].request_id),
            None => false,
        }
    }
}

/// Cache space taken for `input_ids` of request `request_id` this step:
/// the connector is told each, in order.
pub(super) fn notify_allocated(
    connector: &mut Option<Box<dyn EcConnector>>,
    request_id: &str,
    input_ids: &[u32],
) {
    if let Some(connector) = connector.as_mut() {
        for &id in input_ids {
            connector.update_state_after_alloc(request_id, id);
        }
    }
}

/// Whether the connector can supply `input`'s encoder output (none: no).
pub(super) fn has_cache_item(
    connector: &mut Option<Box<dyn EcConnector>>,
    input: &MultimodalInput,
) -> bool {
    connector
        .as_mut()
        .is_some_and(|c| c.has_cache_item(&input.identifier))
}
