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
    not_text(field, obj)?;
    if let Ok(v) = obj.extract::<Vec<u32>>() {
        return Ok(v);
    }
    Err(list_error(field, obj, 0))
}

/// A sequence of draft tokens: token ids, or -1 for a draft slot the
/// proposer left empty (`spec_decode::DRAFT_PADDING`).
pub fn draft_list(field: &str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    not_text(field, obj)?;
    let lowest = crate::spec_decode::DRAFT_PADDING;
    if let Ok(v) = obj.extract::<Vec<i64>>() {
        if v.iter().all(|t| (lowest..=u32::MAX as i64).contains(t)) {
            return Ok(v);
        }
    }
    Err(list_error(field, obj, lowest))
}

fn not_text(field: &str, obj: &Bound<'_, PyAny>) -> PyResult<()> {
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(format!(
            "{field} must be a sequence of ints, got {}",
            type_name(obj)
        )));
    }
    Ok(())
}

/// Walk the items to name the first bad one (ints in `[lowest, u32::MAX]`).
fn list_error(field: &str, obj: &Bound<'_, PyAny>, lowest: i64) -> PyErr {
    match first_bad_item(field, obj, lowest) {
        Err(e) => e,
        Ok(()) => PyTypeError::new_err(format!(
            "{field} must be a sequence of ints, got {}",
            type_name(obj)
        )),
    }
}

fn first_bad_item(field: &str, obj: &Bound<'_, PyAny>, lowest: i64) -> PyResult<()> {
    let items = obj.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "{field} must be a sequence of ints, got {}",
            type_name(obj)
        ))
    })?;
    for (i, item) in items.enumerate() {
        let item = item?;
        let in_range = match item.extract::<i64>() {
            Ok(v) => (lowest..=u32::MAX as i64).contains(&v),
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
                "{field}[{i}] = {} is outside [{lowest}, {}]",
                item.repr()?,
                u32::MAX
            )));
        }
    }
    Ok(())
}
