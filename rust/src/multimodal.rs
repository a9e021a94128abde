//! A request's multimodal inputs as the scheduler sees them
//! (docs/scheduling.md §4.15): where each item's placeholder tokens lie in
//! the prompt, which of them take an encoder embedding, and the identifier
//! that items of equal content share (vLLM's `MultiModalFeatureSpec`: its
//! `mm_position` and `identifier`). The pixels themselves never reach the
//! scheduler.

use crate::error::Error;
use std::ops::Range;

/// One image (audio clip, video) of a prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultimodalInput {
    /// The first placeholder token's position in the prompt.
    pub offset: usize,
    /// Placeholder tokens (at least 1).
    pub length: usize,
    /// Equal for items of equal content (vLLM's `mm_hash`): the encoder
    /// cache shares one entry between them, and the block hashes key the
    /// placeholders by it.
    pub identifier: String,
    /// Embeddings before each placeholder, inclusive (the prefix sums of
    /// vLLM's `is_embed` mask); `None` when every placeholder takes one.
    pub embeds_cumsum: Option<Vec<u32>>,
}

impl MultimodalInput {
    /// An item whose every placeholder takes an embedding.
    pub fn new(offset: usize, length: usize, identifier: impl Into<String>) -> Self {
        MultimodalInput {
            offset,
            length,
            identifier: identifier.into(),
            embeds_cumsum: None,
        }
    }

    /// The same item, only the placeholders where `is_embed` holds taking
    /// an embedding (break and separator tokens do not).
    pub fn with_is_embed(self, is_embed: &[bool]) -> Self {
        let mut sum = 0u32;
        let cumsum = is_embed
            .iter()
            .map(|&e| {
                sum += e as u32;
                sum
            })
            .collect();
        MultimodalInput {
            embeds_cumsum: Some(cumsum),
            ..self
        }
    }

    /// Where its placeholders end (exclusive).
    pub fn end(&self) -> usize {
        self.offset + self.length
    }

    /// Encoder embeddings it takes: what the encoder budget and the encoder
    /// cache count.
    pub fn num_embeds(&self) -> usize {
        match &self.embeds_cumsum {
            None => self.length,
            Some(c) => c.last().copied().unwrap_or(0) as usize,
        }
    }

    /// The embeddings that placeholders `start..end` (relative to the
    /// offset) take, as a range of its encoder output.
    pub fn embeds_in(&self, start: usize, end: usize) -> Range<usize> {
        match &self.embeds_cumsum {
            None => start..end,
            Some(c) => {
                let before = |i: usize| if i == 0 { 0 } else { c[i - 1] as usize };
                before(start)..before(end)
            }
        }
    }
}

/// The inputs whose placeholders overlap positions `start..end`, as a range
/// of indices (inputs sorted by offset, not overlapping: their ends are
/// sorted too).
pub fn inputs_in_window(inputs: &[MultimodalInput], start: usize, end: usize) -> Range<usize> {
    let lo = inputs.partition_point(|m| m.end() < start + 1);
    let hi = inputs.partition_point(|m| m.offset < end);
    lo..hi.max(lo)
}

/// Where a request's multimodal inputs sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputPlacement {
    /// Placeholders inside a prompt of this many tokens (a decoder-only
    /// model's images).
    Prompt { num_prompt_tokens: usize },
    /// An encoder-decoder's encoder input (Whisper's audio): at position 0,
    /// its length the encoder's tokens, apart from the decoder's prompt.
    Encoder,
}

/// The rules a request's inputs keep, checked before it is queued: each
/// input inside the prompt (at position 0 for an encoder's), at least one
/// placeholder long, an `is_embed` mask of its length, an identifier;
/// inputs sorted and apart; an identifier used twice always with the same
/// number of embeddings.
pub fn check_inputs(
    request_id: &str,
    inputs: &[MultimodalInput],
    placement: InputPlacement,
) -> Result<(), Error> {
    let field = |i: usize, what: String| {
        Error::invalid(format!(
            "mm_features[{i}] of request {request_id:?}: {what}"
        ))
    };
    for (i, m) in inputs.iter().enumerate() {
        if m.length == 0 {
            return Err(field(i, "mm_position.length must be >= 1, got 0".into()));
        }
        match placement {
            InputPlacement::Prompt { num_prompt_tokens } if m.end() > num_prompt_tokens => {
                return Err(field(
                    i,
                    format!(
                        "mm_position (offset {}, length {}) ends past the prompt's {} tokens",
                        m.offset, m.length, num_prompt_tokens
                    ),
                ));
            }
            // vLLM asserts it: the encoder runs before the decoder's first token.
            InputPlacement::Encoder if m.offset != 0 => {
                return Err(field(
                    i,
                    format!(
                        "mm_position.offset must be 0 for an encoder-decoder model's \
                         encoder input, got {}",
                        m.offset
                    ),
                ));
            }
            _ => {}
        }
        if let Some(c) = &m.embeds_cumsum {
            if c.len() != m.length {
                return Err(field(
                    i,
                    format!(
                        "mm_position.is_embed has {} entries; it must have length ({})",
                        c.len(),
                        m.length
                    ),
                ));
            }
        }
        if m.identifier.is_empty() {
            return Err(field(i, "identifier must not be empty".into()));
        }
        // An encoder's inputs all sit at 0.
        let in_prompt = placement != InputPlacement::Encoder;
        if in_prompt && i > 0 && inputs[i - 1].end() > m.offset {
            return Err(field(
                i,
                format!(
                    "mm_position.offset ({}) must not be before the end of mm_features[{}] ({})",
                    m.offset,
                    i - 1,
                    inputs[i - 1].end()
                ),
            ));
        }
        if let Some(j) = inputs[..i]
            .iter()
            .position(|o| o.identifier == m.identifier && o.num_embeds() != m.num_embeds())
        {
            return Err(field(
                i,
                format!(
                    "identifier {:?} takes {} embeddings here but {} at mm_features[{j}]",
                    m.identifier,
                    m.num_embeds(),
                    inputs[j].num_embeds()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> Vec<MultimodalInput> {
        vec![
            MultimodalInput::new(2, 4, "a"),
            MultimodalInput::new(10, 3, "b"),
        ]
    }

    #[test]
    fn the_window_finds_every_overlap_and_no_other() {
        let m = inputs();
        assert_eq!(inputs_in_window(&m, 0, 2), 0..0);
        assert_eq!(inputs_in_window(&m, 0, 3), 0..1);
        assert_eq!(inputs_in_window(&m, 5, 6), 0..1);
        assert_eq!(inputs_in_window(&m, 6, 10), 1..1);
        assert_eq!(inputs_in_window(&m, 6, 11), 1..2);
        assert_eq!(inputs_in_window(&m, 0, 100), 0..2);
        assert_eq!(inputs_in_window(&m, 13, 20), 2..2);
    }

    #[test]
    fn a_mask_counts_only_its_embeddings() {
        let m = MultimodalInput::new(2, 5, "x").with_is_embed(&[false, true, false, true, true]);
        assert_eq!(m.num_embeds(), 3);
        assert_eq!(m.embeds_in(3, 5), 1..3);
        assert_eq!(m.embeds_in(0, 1), 0..0);
        assert_eq!(MultimodalInput::new(0, 4, "y").embeds_in(1, 3), 1..3);
    }

    #[test]
    fn bad_inputs_name_the_field() {
        let ok = inputs();
        let prompt = |num_prompt_tokens| InputPlacement::Prompt { num_prompt_tokens };
        assert!(check_inputs("r", &ok, prompt(13)).is_ok());
        let e = check_inputs("r", &ok, prompt(12)).unwrap_err().to_string();
        assert!(
            e.contains("mm_features[1]") && e.contains("past the prompt"),
            "{e}"
        );
        let overlap = vec![
            MultimodalInput::new(0, 4, "a"),
            MultimodalInput::new(3, 2, "b"),
        ];
        let e = check_inputs("r", &overlap, prompt(10))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("mm_features[1]") && e.contains("offset (3)"),
            "{e}"
        );
        let empty = vec![MultimodalInput::new(0, 0, "a")];
        assert!(check_inputs("r", &empty, prompt(10)).is_err());
        let mask = vec![MultimodalInput::new(0, 3, "a").with_is_embed(&[true])];
        assert!(check_inputs("r", &mask, prompt(10)).is_err());
        let reused = vec![
            MultimodalInput::new(0, 3, "a"),
            MultimodalInput::new(4, 2, "a"),
        ];
        let e = check_inputs("r", &reused, prompt(10))
            .unwrap_err()
            .to_string();
        assert!(e.contains("takes 2 embeddings"), "{e}");
    }

    #[test]
    fn an_encoders_inputs_sit_at_zero_past_the_decoders_prompt() {
        let audio = vec![MultimodalInput::new(0, 1500, "a")];
        assert!(check_inputs("r", &audio, InputPlacement::Encoder).is_ok());
        let later = vec![MultimodalInput::new(1, 1500, "a")];
        let e = check_inputs("r", &later, InputPlacement::Encoder)
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be 0") && e.contains("got 1"), "{e}");
    }
}
