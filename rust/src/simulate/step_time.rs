//! How long a step takes: a step-time model of the batch's shape, plus the
//! engine's CPU overhead per step.
//!
//! Two models: a linear one (fitted by `ironbatch profile` on a real
//! engine, or written by hand) and a roofline one (a model's weights and KV
//! cache over a device's memory bandwidth, its FLOPs over the device's
//! peak, whichever is slower, plus a fixed launch cost per step). Python
//! computes the roofline's constants from a model config and a device
//! preset (`ironbatch.simulation.step_models`); this file only evaluates.

use crate::error::Error;
use crate::step::StepOutput;

/// What a step-time model reads of a step.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct BatchShape {
    /// Requests scheduled.
    pub num_requests: usize,
    /// Rows that are not decode rows (each has per-row work: a new
    /// request's runner state, its attention metadata).
    pub num_prefill_requests: usize,
    /// Tokens of rows that compute more than one token or sample none
    /// (prompt chunks, recomputation after a preemption).
    pub num_prefill_tokens: usize,
    /// Tokens of rows that compute one token and sample it.
    pub num_decode_tokens: usize,
    /// Rows that sample a token (the LM head runs for them).
    pub num_sampled: usize,
    /// Summed sequence lengths after the step (`num_computed_tokens +
    /// num_scheduled` per row): the KV cache attention reads.
    pub context_tokens: usize,
    /// Summed query-key pairs of causal attention: a row of `n` new tokens
    /// after `c` computed ones has `n·c + n·(n+1)/2`.
    pub attention_pairs: f64,
}

impl BatchShape {
    /// The shape of a step the scheduler decided.
    pub fn of(step: &StepOutput) -> Self {
        let mut s = BatchShape {
            num_requests: step.entries.len(),
            ..Default::default()
        };
        for e in &step.entries {
            let (n, c) = (e.num_tokens, e.num_computed_tokens);
            if n == 1 && e.samples {
                s.num_decode_tokens += 1;
            } else {
                s.num_prefill_tokens += n;
                s.num_prefill_requests += 1;
            }
            s.num_sampled += e.samples as usize;
            s.context_tokens += c + n;
            let (n, c) = (n as f64, c as f64);
            s.attention_pairs += n * c + n * (n + 1.0) / 2.0;
        }
        s
    }

    /// Tokens computed in the step.
    pub fn num_tokens(&self) -> usize {
        self.num_prefill_tokens + self.num_decode_tokens
    }
}

/// Seconds per unit of each part of a batch; a step takes their sum.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct LinearModel {
    pub intercept_s: f64,
    pub per_request_s: f64,
    pub per_prefill_request_s: f64,
    pub per_prefill_token_s: f64,
    pub per_decode_token_s: f64,
    pub per_sampled_s: f64,
    pub per_context_token_s: f64,
    pub per_attention_pair_s: f64,
}

/// The roofline: bytes moved over bandwidth or FLOPs over peak, whichever
/// takes longer, plus a fixed cost per step (kernel launches).
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct RooflineModel {
    /// Weights read once per step.
    pub weight_bytes: f64,
    /// KV-cache bytes per token of context (all layers, K and V).
    pub kv_bytes_per_token: f64,
    /// FLOPs per computed token of the dense layers (2 × parameters).
    pub flops_per_token: f64,
    /// FLOPs per query-key pair (QKᵀ and PV over all layers and heads).
    pub flops_per_attention_pair: f64,
    /// FLOPs of the LM head per sampled row.
    pub flops_per_sampled: f64,
    /// Achievable bytes per second and FLOPs per second.
    pub bytes_per_s: f64,
    pub flops_per_s: f64,
    /// Per step: launches and synchronisation, whatever the batch.
    pub fixed_s: f64,
}

/// A step-time model of the batch.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum StepModel {
    Linear(LinearModel),
    Roofline(RooflineModel),
}

/// The engine's CPU time per step (scheduling, input preparation, output
/// processing): it delays the step's launch under synchronous scheduling
/// and overlaps the previous step under async scheduling.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct CpuOverhead {
    pub per_step_s: f64,
    pub per_request_s: f64,
}

/// A step model and the engine's overhead: the simulation's clock.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct StepTime {
    pub model: StepModel,
    pub overhead: CpuOverhead,
}

fn finite_non_negative(field: &str, v: f64) -> Result<(), Error> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{field} must be a finite number >= 0, got {v}"
        )))
    }
}

impl StepTime {
    /// Every coefficient must be finite and non-negative (a negative one
    /// could run the clock backwards); the roofline's rates positive.
    pub fn validate(&self) -> Result<(), Error> {
        finite_non_negative("overhead.per_step_s", self.overhead.per_step_s)?;
        finite_non_negative("overhead.per_request_s", self.overhead.per_request_s)?;
        match &self.model {
            StepModel::Linear(m) => {
                for (field, v) in [
                    ("intercept_s", m.intercept_s),
                    ("per_request_s", m.per_request_s),
                    ("per_prefill_request_s", m.per_prefill_request_s),
                    ("per_prefill_token_s", m.per_prefill_token_s),
                    ("per_decode_token_s", m.per_decode_token_s),
                    ("per_sampled_s", m.per_sampled_s),
                    ("per_context_token_s", m.per_context_token_s),
                    ("per_attention_pair_s", m.per_attention_pair_s),
                ] {
                    finite_non_negative(field, v)?;
                }
            }
            StepModel::Roofline(m) => {
                for (field, v) in [
                    ("weight_bytes", m.weight_bytes),
                    ("kv_bytes_per_token", m.kv_bytes_per_token),
                    ("flops_per_token", m.flops_per_token),
                    ("flops_per_attention_pair", m.flops_per_attention_pair),
                    ("flops_per_sampled", m.flops_per_sampled),
                    ("fixed_s", m.fixed_s),
                ] {
                    finite_non_negative(field, v)?;
                }
                for (field, v) in [
                    ("bytes_per_s", m.bytes_per_s),
                    ("flops_per_s", m.flops_per_s),
                ] {
                    if !(v.is_finite() && v > 0.0) {
                        return Err(Error::invalid(format!(
                            "{field} must be a finite number > 0, got {v}"
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// The model's time for a batch; an empty step runs no model.
    pub fn model_s(&self, s: &BatchShape) -> f64 {
        if s.num_requests == 0 {
            return 0.0;
        }
        match &self.model {
            StepModel::Linear(m) => {
                m.intercept_s
                    + m.per_request_s * s.num_requests as f64
                    + m.per_prefill_request_s * s.num_prefill_requests as f64
                    + m.per_prefill_token_s * s.num_prefill_tokens as f64
                    + m.per_decode_token_s * s.num_decode_tokens as f64
                    + m.per_sampled_s * s.num_sampled as f64
                    + m.per_context_token_s * s.context_tokens as f64
                    + m.per_attention_pair_s * s.attention_pairs
            }
            StepModel::Roofline(m) => {
                let bytes = m.weight_bytes + m.kv_bytes_per_token * s.context_tokens as f64;
                let flops = m.flops_per_token * s.num_tokens() as f64
                    + m.flops_per_attention_pair * s.attention_pairs
                    + m.flops_per_sampled * s.num_sampled as f64;
                (bytes / m.bytes_per_s).max(flops / m.flops_per_s) + m.fixed_s
            }
        }
    }

    /// The engine's CPU time around a step of `num_requests` requests.
    pub fn overhead_s(&self, num_requests: usize) -> f64 {
        self.overhead.per_step_s + self.overhead.per_request_s * num_requests as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roofline_step_is_bound_by_the_slower_resource() {
        let m = RooflineModel {
            weight_bytes: 1e9,
            kv_bytes_per_token: 1e5,
            flops_per_token: 1e9,
            bytes_per_s: 1e12,
            flops_per_s: 1e14,
            ..Default::default()
        };
        let t = StepTime {
            model: StepModel::Roofline(m),
            overhead: CpuOverhead::default(),
        };
        let decode = BatchShape {
            num_requests: 8,
            num_decode_tokens: 8,
            context_tokens: 8000,
            ..Default::default()
        };
        // Memory: (1e9 + 8e8) B / 1e12 B/s = 1.8 ms beats 8e9 FLOP / 1e14.
        assert!((t.model_s(&decode) - 1.8e-3).abs() < 1e-12);
        let prefill = BatchShape {
            num_requests: 1,
            num_prefill_tokens: 4096,
            context_tokens: 4096,
            ..Default::default()
        };
        // Compute: 4.096e12 FLOP / 1e14 = 41 ms.
        assert!((t.model_s(&prefill) - 4.096e-2).abs() < 1e-12);
        assert_eq!(t.model_s(&BatchShape::default()), 0.0);
    }

    #[test]
    fn negative_coefficients_are_refused_by_name() {
        let t = StepTime {
            model: StepModel::Linear(LinearModel {
                per_decode_token_s: -1.0,
                ..Default::default()
            }),
            overhead: CpuOverhead::default(),
        };
        let e = t.validate().unwrap_err().to_string();
        assert!(e.contains("per_decode_token_s") && e.contains("-1"), "{e}");
    }
}
