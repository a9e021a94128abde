//! The core's errors: one variant per cause. Every check runs before any
//! state changes, so a call that returns an error leaves everything exactly
//! as it was. The bindings turn each variant into its Python exception in
//! one place (`python/errors.rs`).

use std::fmt;

/// Why the core refused a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// A setting or argument is out of range, or does not fit the state it
    /// applies to; the message names the field and the value.
    InvalidArgument(String),
    /// `add_request` with the id of a request that is still live.
    DuplicateRequest(String),
    /// A request id that names no live request.
    UnknownRequest(String),
    /// `update_from_output` with a step that another scheduler made.
    ForeignStep,
    /// `update_from_output` with a step whose output was already applied.
    StepAlreadyApplied,
    /// The operating system gave no randomness for the secret hash key.
    NoRandomness(String),
}

impl Error {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(msg) => f.write_str(msg),
            Error::DuplicateRequest(id) => write!(f, "request_id {id:?} is already live"),
            Error::UnknownRequest(id) => write!(f, "request_id {id:?} is not a known request"),
            Error::ForeignStep => f.write_str("this step was scheduled by another scheduler"),
            Error::StepAlreadyApplied => f.write_str("this step's output was already applied"),
            Error::NoRandomness(why) => write!(f, "no OS randomness for the hash key: {why}"),
        }
    }
}

impl std::error::Error for Error {}
