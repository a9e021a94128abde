//! What a request may carry besides its tokens, read from vLLM's objects
//! or anything with their attributes: its LoRA adapter (`LoRARequest`) and
//! its multimodal inputs (`MultiModalFeatureSpec`).

use super::args::count;
use crate::lora::LoraAdapter;
use crate::multimodal::MultimodalInput;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A request's LoRA adapter from anything with vLLM's `LoRARequest`
/// attributes (`lora_int_id`, `lora_name`, `lora_path`).
pub(super) fn lora_adapter(lora: &Bound<'_, PyAny>) -> PyResult<LoraAdapter> {
    let field = |name: &str| {
        lora.getattr(name).map_err(|_| {
            PyTypeError::new_err(format!(
                "lora_request must have vLLM's LoRARequest fields (lora_int_id, lora_name, \
                 lora_path); it has no {name}"
            ))
        })
    };
    let text = |name: &str| -> PyResult<String> {
        field(name)?
            .extract()
            .map_err(|_| PyTypeError::new_err(format!("lora_request.{name} must be a str")))
    };
    let id = count("lora_request.lora_int_id", &field("lora_int_id")?)?;
    Ok(LoraAdapter {
        id: u32::try_from(id).map_err(|_| {
            PyValueError::new_err(format!(
                "lora_request.lora_int_id must be in [1, {}], got {id}",
                u32::MAX
            ))
        })?,
        name: text("lora_name")?,
        path: text("lora_path")?,
    })
}

/// A request's multimodal inputs from a sequence of objects with vLLM's
/// `MultiModalFeatureSpec` attributes (`identifier`, and `mm_position` with
/// `offset`, `length` and `is_embed`), or with `identifier`, `offset`,
/// `length` and `is_embed` themselves (`ironbatch.MultimodalInput`).
pub(super) fn mm_inputs<'py>(features: &Bound<'py, PyAny>) -> PyResult<Vec<MultimodalInput>> {
    let mut out = Vec::new();
    for (i, feature) in features.try_iter()?.enumerate() {
        let feature = feature?;
        let name = |field: &str| format!("mm_features[{i}].{field}");
        let position = match feature.getattr("mm_position") {
            Ok(p) => p,
            Err(_) => feature.clone(),
        };
        let attr = |obj: &Bound<'py, PyAny>, field: &str| -> PyResult<Bound<'py, PyAny>> {
            obj.getattr(field).map_err(|_| {
                PyTypeError::new_err(format!(
                    "{} is missing: a multimodal feature needs identifier, offset, length \
                     (or vLLM's mm_position) and is_embed",
                    name(field)
                ))
            })
        };
        let offset = count(&name("offset"), &attr(&position, "offset")?)?;
        let length = count(&name("length"), &attr(&position, "length")?)?;
        let identifier: String = attr(&feature, "identifier")?
            .extract()
            .map_err(|_| PyTypeError::new_err(format!("{} must be a str", name("identifier"))))?;
        let mut input = MultimodalInput::new(offset, length, identifier);
        let is_embed = position.getattr("is_embed").ok().filter(|m| !m.is_none());
        if let Some(mask) = is_embed {
            // A torch tensor (vLLM) or a list of bools.
            let mask = match mask.call_method0("tolist") {
                Ok(list) => list,
                Err(_) => mask,
            };
            let mask: Vec<bool> = mask.extract().map_err(|_| {
                PyValueError::new_err(format!("{} must be a list of bools", name("is_embed")))
            })?;
            input = input.with_is_embed(&mask);
        }
        out.push(input);
    }
    Ok(out)
}
