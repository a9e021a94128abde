//! The core's errors as Python exceptions, in one place: `?` on a core
//! call raises the right one.

use crate::error::Error;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::PyErr;

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        match e {
            // Bad arguments, ids and steps are the caller's values: ValueError,
            // as Python raises for a value of the right type that won't do.
            Error::InvalidArgument(_)
            | Error::DuplicateRequest(_)
            | Error::UnknownRequest(_)
            | Error::ForeignStep
            | Error::StepAlreadyApplied => PyValueError::new_err(e.to_string()),
            Error::NoRandomness(_) => PyOSError::new_err(e.to_string()),
        }
    }
}
