//! A simulated workload: when each request arrives, its prompt and how many
//! tokens it generates, as columns.
//!
//! Request traces record lengths, and sometimes which prompt blocks two
//! requests share (Mooncake's `hash_ids`), never the tokens. A prompt is
//! therefore described as *segments*, each a key and a length: a segment's
//! tokens are a fixed function of its key and the position inside it, so
//! two requests that list the same key first get the same leading tokens,
//! and the prefix cache sees the same reuse the trace describes. A prompt
//! may end with literal tokens (an ironbatch trace's own prompts).

use crate::error::Error;

/// Tokens below this are left to the special ids (0 padding, 1 BOS, 2 EOS).
const FIRST_TOKEN: u32 = 3;

/// The workload, one entry per request in arrival order.
#[derive(Clone, Debug, Default)]
pub struct Workload {
    /// Seconds from the start, non-decreasing.
    pub arrival_s: Vec<f64>,
    /// Tokens each request generates (its `max_tokens`; it ignores EOS).
    pub output_tokens: Vec<usize>,
    /// Request `i`'s segments are `segment_offsets[i]..segment_offsets[i + 1]`.
    pub segment_offsets: Vec<usize>,
    pub segment_keys: Vec<u64>,
    pub segment_lengths: Vec<usize>,
    /// Request `i`'s literal tokens, after its segments:
    /// `literal_tokens[literal_offsets[i]..literal_offsets[i + 1]]`.
    pub literal_offsets: Vec<usize>,
    pub literal_tokens: Vec<u32>,
    /// Generated tokens lie in `[3, vocab_size)`.
    pub vocab_size: u32,
}

/// SplitMix64's finaliser: a cheap, well-mixed 64-bit hash.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Token `position` of segment `key`, in `[3, vocab_size)`.
pub fn segment_token(key: u64, position: usize, vocab_size: u32) -> u32 {
    token_of(mix(key), position, vocab_size)
}

/// [`segment_token`] with the key already mixed (once per segment).
fn token_of(mixed_key: u64, position: usize, vocab_size: u32) -> u32 {
    let span = (vocab_size - FIRST_TOKEN) as u64;
    FIRST_TOKEN + (mix(mixed_key ^ position as u64) % span) as u32
}

fn rising(field: &str, offsets: &[usize], rows: usize, items: usize) -> Result<(), Error> {
    if offsets.len() != rows + 1 {
        return Err(Error::invalid(format!(
            "{field} has {} entries; {rows} requests need {}",
            offsets.len(),
            rows + 1
        )));
    }
    let ok = offsets[0] == 0 && offsets.windows(2).all(|w| w[0] <= w[1]);
    if !ok || offsets[rows] != items {
        return Err(Error::invalid(format!(
            "{field} must rise from 0 to {items}, the number of items"
        )));
    }
    Ok(())
}

impl Workload {
    /// Requests in the workload.
    pub fn len(&self) -> usize {
        self.arrival_s.len()
    }

    pub fn is_empty(&self) -> bool {
        self.arrival_s.is_empty()
    }

    /// Check the columns agree and every value is usable, naming the first
    /// that is not.
    pub fn validate(&self) -> Result<(), Error> {
        let n = self.len();
        if self.output_tokens.len() != n {
            return Err(Error::invalid(format!(
                "output_tokens has {} entries for {n} requests",
                self.output_tokens.len()
            )));
        }
        if self.vocab_size <= FIRST_TOKEN {
            return Err(Error::invalid(format!(
                "vocab_size must be > {FIRST_TOKEN}, got {}",
                self.vocab_size
            )));
        }
        let segments = self.segment_keys.len();
        if self.segment_lengths.len() != segments {
            return Err(Error::invalid(format!(
                "segment_lengths has {} entries for {segments} segment keys",
                self.segment_lengths.len()
            )));
        }
        rising("segment_offsets", &self.segment_offsets, n, segments)?;
        rising(
            "literal_offsets",
            &self.literal_offsets,
            n,
            self.literal_tokens.len(),
        )?;
        let mut previous = 0.0;
        for (i, &t) in self.arrival_s.iter().enumerate() {
            if !t.is_finite() || t < previous {
                return Err(Error::invalid(format!(
                    "arrival_s[{i}] = {t}: arrivals must be finite, >= 0 and in order"
                )));
            }
            previous = t;
        }
        if let Some(i) = self.output_tokens.iter().position(|&o| o == 0) {
            return Err(Error::invalid(format!(
                "output_tokens[{i}] = 0: every request generates at least one token"
            )));
        }
        for i in 0..n {
            if self.prompt_len(i) == 0 {
                return Err(Error::invalid(format!("request {i} has an empty prompt")));
            }
        }
        Ok(())
    }

    /// Request `i`'s prompt length.
    pub fn prompt_len(&self, i: usize) -> usize {
        let segments = self.segment_offsets[i]..self.segment_offsets[i + 1];
        let generated: usize = self.segment_lengths[segments].iter().sum();
        generated + self.literal_offsets[i + 1] - self.literal_offsets[i]
    }

    /// Request `i`'s prompt tokens, written into `out` (cleared first).
    pub fn prompt_into(&self, i: usize, out: &mut Vec<u32>) {
        out.clear();
        for s in self.segment_offsets[i]..self.segment_offsets[i + 1] {
            let key = mix(self.segment_keys[s]); // once per segment
            out.extend((0..self.segment_lengths[s]).map(|k| token_of(key, k, self.vocab_size)));
        }
        out.extend_from_slice(
            &self.literal_tokens[self.literal_offsets[i]..self.literal_offsets[i + 1]],
        );
    }

    /// Request `i`'s prompt tokens.
    pub fn prompt(&self, i: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.prompt_len(i));
        self.prompt_into(i, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_sharing_a_segment() -> Workload {
        Workload {
            arrival_s: vec![0.0, 1.0],
            output_tokens: vec![4, 2],
            segment_offsets: vec![0, 2, 4],
            segment_keys: vec![7, 100, 7, 101],
            segment_lengths: vec![32, 5, 32, 9],
            literal_offsets: vec![0, 0, 2],
            literal_tokens: vec![11, 12],
            vocab_size: 32000,
        }
    }

    #[test]
    fn a_shared_key_gives_the_same_leading_tokens() {
        let w = two_sharing_a_segment();
        w.validate().unwrap();
        let (a, b) = (w.prompt(0), w.prompt(1));
        assert_eq!((a.len(), b.len()), (37, 43));
        assert_eq!(a[..32], b[..32]);
        assert_ne!(a[32..37], b[32..37]);
        assert_eq!(b[41..], [11, 12]);
        assert!(a.iter().all(|&t| (3..32000).contains(&t)));
    }

    #[test]
    fn bad_columns_are_named() {
        let mut w = two_sharing_a_segment();
        w.arrival_s[1] = -1.0;
        let e = w.validate().unwrap_err().to_string();
        assert!(e.contains("arrival_s[1]"), "{e}");
        let mut w = two_sharing_a_segment();
        w.output_tokens[0] = 0;
        assert!(w
            .validate()
            .unwrap_err()
            .to_string()
            .contains("output_tokens[0]"));
        let mut w = two_sharing_a_segment();
        w.segment_offsets[2] = 3;
        assert!(w
            .validate()
            .unwrap_err()
            .to_string()
            .contains("segment_offsets"));
    }
}
