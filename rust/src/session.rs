//! Streaming-input sessions (docs/scheduling.md §4.12): a request whose input
//! arrives in chunks under one id (vLLM's `resumable` requests). When a turn
//! stops, the session keeps its KV cache and waits for the next chunk; each
//! chunk continues it from all it has but its last sampled token. A chunk
//! that arrives early waits in the session's queue; a chunk that is not
//! resumable ends the input.

use crate::multimodal::MultimodalInput;
use crate::request::StopRules;
use std::collections::VecDeque;

/// One input chunk of a session: its tokens, its images (placed within
/// the chunk) and the rules of its turn.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionUpdate {
    pub prompt_token_ids: Vec<u32>,
    /// Offsets count from the chunk's first token; applying the chunk
    /// moves them past what the session keeps, as vLLM does.
    pub mm_inputs: Vec<MultimodalInput>,
    pub stop: StopRules,
    /// Seconds; replaces the session's arrival time when applied.
    pub arrival_time: f64,
}

/// A session's chunks not applied yet, in arrival order; `None` ends the
/// input (the turn that takes it is the session's last).
pub type SessionQueue = VecDeque<Option<SessionUpdate>>;
