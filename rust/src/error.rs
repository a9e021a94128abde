//! Errors the core reports for bad input. Every check runs before any state
//! changes, so a rejected call leaves the pool exactly as it was.

use std::fmt;

/// A request to the KV-cache core that cannot be carried out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvError {
    /// A configuration or argument value is out of range; the message names
    /// the field and the value.
    Invalid(String),
}

impl KvError {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        KvError::Invalid(msg.into())
    }
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::Invalid(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for KvError {}
