//! Speculative decoding on the scheduler's side (docs/scheduling.md §4.13,
//! §5.7): a request's draft tokens for its next step, and vLLM's
//! `SpecDecodingStats` for what the verification accepted.
//!
//! Where drafts come from is the model runner's business (a proposer:
//! n-gram lookup, EAGLE, MTP, a draft model). The scheduler only schedules
//! them as extra tokens of a decode step and, when the step's output comes
//! back, rolls back the positions of the drafts that were rejected.

/// A draft slot the proposer left empty: vLLM's `ngram_gpu` proposer hands
/// over `k` drafts per request and pads the ones it found no match for with
/// -1. vLLM's scheduler keeps the padding as drafts (scheduled, counted in
/// the stats, always rejected) and strips it only before a grammar sees the
/// drafts (docs/scheduling.md §4.13).
pub const DRAFT_PADDING: i64 = -1;

/// A request's drafts for its next step (vLLM's `spec_token_ids`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
// A tag byte, not the Vec capacity's niche: a decode asks `len` about five
// times, and decoding the niche cost 15 instructions a request (callgrind).
#[repr(u8)]
pub enum Drafts {
    /// Proposed tokens (synchronous scheduling: the runner hands them over
    /// after each step's output): token ids, or `DRAFT_PADDING`. Empty: none.
    Tokens(Vec<i64>),
    /// Async scheduling: `k` positions reserved for drafts the runner
    /// proposes while this step runs; the scheduler never sees their ids
    /// (vLLM's `[-1] * k`).
    Placeholders(usize),
    /// No drafts.
    #[default]
    None,
}

impl Drafts {
    #[inline]
    pub fn len(&self) -> usize {
        match self {
            Drafts::Tokens(t) => t.len(),
            Drafts::Placeholders(k) => *k,
            Drafts::None => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first `n` drafts as the step's column holds them (-1 for a
    /// placeholder).
    pub fn first(&self, n: usize) -> Drafts {
        match self {
            Drafts::Tokens(t) => Drafts::Tokens(t[..n.min(t.len())].to_vec()),
            Drafts::Placeholders(k) => Drafts::Placeholders(n.min(*k)),
            Drafts::None => Drafts::None,
        }
    }

    /// Append the drafts to a step column (-1 for a placeholder).
    #[inline]
    pub fn write_to(&self, column: &mut Vec<i64>) {
        match self {
            Drafts::Tokens(t) => column.extend_from_slice(t),
            Drafts::Placeholders(k) => column.extend(std::iter::repeat_n(-1, *k)),
            Drafts::None => {}
        }
    }
}

/// vLLM's `SpecDecodingStats` for one `update_from_output`: drafts verified
/// and accepted, over every request of the step that had drafts scheduled
/// and got tokens back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecDecodingStats {
    /// `num_speculative_tokens`: the length of the per-position counts.
    pub num_spec_tokens: usize,
    /// Requests whose drafts were verified.
    pub num_drafts: u64,
    /// Draft tokens verified (placeholders and padding included, as vLLM
    /// counts them).
    pub num_draft_tokens: u64,
    /// Draft tokens accepted (before a stop trimmed any).
    pub num_accepted_tokens: u64,
    /// Per draft position: how often it was accepted ...
    pub num_accepted_tokens_per_pos: Vec<u64>,
    /// ... and how often there was a draft at it.
    pub num_draft_tokens_per_pos: Vec<u64>,
}

impl SpecDecodingStats {
    pub fn new(num_spec_tokens: usize) -> Self {
        SpecDecodingStats {
            num_spec_tokens,
            num_drafts: 0,
            num_draft_tokens: 0,
            num_accepted_tokens: 0,
            num_accepted_tokens_per_pos: vec![0; num_spec_tokens],
            num_draft_tokens_per_pos: vec![0; num_spec_tokens],
        }
    }

    /// One request's verification: `num_draft_tokens` drafts (at most
    /// `num_spec_tokens`), `num_accepted` of them accepted.
    pub fn observe(&mut self, num_draft_tokens: usize, num_accepted: usize) {
        self.num_drafts += 1;
        self.num_draft_tokens += num_draft_tokens as u64;
        self.num_accepted_tokens += num_accepted as u64;
        for n in &mut self.num_accepted_tokens_per_pos[..num_accepted] {
            *n += 1;
        }
        for n in &mut self.num_draft_tokens_per_pos[..num_draft_tokens] {
            *n += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_keeps_a_prefix_of_tokens_or_placeholders() {
        assert_eq!(
            Drafts::Tokens(vec![5, 6, 7]).first(2),
            Drafts::Tokens(vec![5, 6])
        );
        assert_eq!(Drafts::Placeholders(3).first(5), Drafts::Placeholders(3));
        let mut column = Vec::new();
        Drafts::Placeholders(2).write_to(&mut column);
        Drafts::Tokens(vec![9]).write_to(&mut column);
        assert_eq!(column, vec![-1, -1, 9]);
    }

    #[test]
    fn stats_count_per_position() {
        let mut s = SpecDecodingStats::new(3);
        s.observe(3, 1);
        s.observe(2, 2);
        assert_eq!(
            (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens),
            (2, 5, 3)
        );
        assert_eq!(s.num_accepted_tokens_per_pos, vec![2, 1, 0]);
        assert_eq!(s.num_draft_tokens_per_pos, vec![2, 2, 1]);
    }
}
