//! Argument conversion with errors that name the field and the value.

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyString};

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A non-negative int (Python ints, NumPy ints, anything with `__index__`).
pub fn count(field: &str, obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    match obj.extract::<i64>() {
        Ok(v) if v >= 0 => Ok(v as usize),
        Ok(v) => Err(PyValueError::new_err(format!(
            "{field} must be >= 0, got {v}"
        ))),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Err(PyValueError::new_err(
            format!("{field} = {} is out of range", obj.repr()?),
        )),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{field} must be an int, got {}",
            type_name(obj)
        ))),
    }
}

/// A sequence of u32 values (token ids or block ids). The fast path is
/// PyO3's own conversion; only a failure walks the items to name the
/// culprit.
pub fn u32_list(field: &str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(format!(
            "{field} must be a sequence of ints, got {}",
            type_name(obj)
        )));
    }
    if let Ok(v) = obj.extract::<Vec<u32>>() {
        return Ok(v);
    }
    Err(u32_list_error(field, obj))
}

/// Walk the items to name the first bad one.
fn u32_list_error(field: &str, obj: &Bound<'_, PyAny>) -> PyErr {
    match first_bad_item(field, obj) {
        Err(e) => e,
        Ok(()) => PyTypeError::new_err(format!(
            "{field} must be a sequence of ints, got {}",
            type_name(obj)
        )),
    }
}

fn first_bad_item(field: &str, obj: &Bound<'_, PyAny>) -> PyResult<()> {
    let items = obj.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "{field} must be a sequence of ints, got {}",
            type_name(obj)
        ))
    })?;
    for (i, item) in items.enumerate() {
        let item = item?;
        let in_range = match item.extract::<i64>() {
            Ok(v) => (0..=u32::MAX as i64).contains(&v),
            Err(_) if item.is_instance_of::<PyInt>() => false, // beyond i64
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                    "{field}[{i}] must be an int, got {}",
                    type_name(&item)
                )))
            }
        };
        if !in_range {
            return Err(PyValueError::new_err(format!(
                "{field}[{i}] = {} is outside [0, {}]",
                item.repr()?,
                u32::MAX
            )));
        }
    }
    Ok(())
}
