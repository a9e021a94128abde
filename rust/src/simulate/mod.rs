//! `ironbatch simulate`'s engine: a request trace through the core's
//! scheduler on a simulated clock, at thousands of times real time.
//!
//! The decisions are the core's own ([`crate::scheduler::Scheduler`], every
//! setting it has); the clock is a step-time model of each step's batch plus
//! the engine's CPU overhead ([`step_time`]); the loop ([`clock`]) adds each
//! request when it has arrived, schedules, samples a token for every
//! sampling row, applies it, and records what happened ([`metrics`]) —
//! with no Python per step. [`workload`] describes the requests as
//! columns; [`trace_writer`] writes a run as an ironbatch-trace/1 file.

pub mod clock;
pub mod metrics;
pub mod step_time;
pub mod trace_writer;
pub mod workload;

#[cfg(test)]
mod tests;

pub use clock::{simulate, SimOptions, SimOutput};
pub use metrics::{Decisions, RequestRecords, StepSeries};
pub use step_time::{BatchShape, CpuOverhead, LinearModel, RooflineModel, StepModel, StepTime};
pub use trace_writer::TraceWriter;
pub use workload::{segment_token, Workload};
