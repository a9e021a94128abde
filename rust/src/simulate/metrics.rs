//! What a simulation records: per request, when things happened to it; per
//! step, the clock and the scheduler's state; optionally, every step's
//! decisions.

/// Per request, in workload order. Times are seconds on the simulated
/// clock; NaN where it never happened (a request the run did not reach).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestRecords {
    pub arrival_s: Vec<f64>,
    /// When the first step that scheduled it started.
    pub first_scheduled_s: Vec<f64>,
    /// When the step that sampled its first token ended.
    pub first_token_s: Vec<f64>,
    /// When the step that sampled its last token ended.
    pub finish_s: Vec<f64>,
    pub prompt_tokens: Vec<u64>,
    /// Tokens it generated.
    pub output_tokens: Vec<u64>,
    /// Prompt tokens its first admission found in the prefix cache.
    pub prefix_hit_tokens: Vec<u64>,
    pub preemptions: Vec<u32>,
}

impl RequestRecords {
    pub fn new(arrival_s: &[f64], prompt_tokens: Vec<u64>) -> Self {
        let n = arrival_s.len();
        RequestRecords {
            arrival_s: arrival_s.to_vec(),
            first_scheduled_s: vec![f64::NAN; n],
            first_token_s: vec![f64::NAN; n],
            finish_s: vec![f64::NAN; n],
            prompt_tokens,
            output_tokens: vec![0; n],
            prefix_hit_tokens: vec![0; n],
            preemptions: vec![0; n],
        }
    }
}

/// Per executed step, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepSeries {
    /// When the step started on the device, and how long it ran there.
    pub start_s: Vec<f64>,
    pub duration_s: Vec<f64>,
    pub num_scheduled_reqs: Vec<u32>,
    pub num_prefill_tokens: Vec<u32>,
    pub num_decode_tokens: Vec<u32>,
    /// The scheduler's queues and KV-cache usage right after `schedule()`.
    pub num_running: Vec<u32>,
    pub num_waiting: Vec<u32>,
    pub kv_usage: Vec<f32>,
    pub num_preempted: Vec<u32>,
}

/// Every step's decisions, flattened: step `s` scheduled
/// `request[offsets[s]..offsets[s + 1]]` for as many `num_tokens`, in
/// scheduling order.
#[derive(Clone, Debug, PartialEq)]
pub struct Decisions {
    pub offsets: Vec<u64>,
    pub request: Vec<u32>,
    pub num_tokens: Vec<u32>,
}

impl Default for Decisions {
    fn default() -> Self {
        Decisions {
            offsets: vec![0],
            request: Vec::new(),
            num_tokens: Vec::new(),
        }
    }
}
