//! What the fake checks in a request, the way the real Responses API does: content part types,
//! tool shapes, `tool_choice`, strict function schemas, unanswered function calls, unknown
//! `previous_response_id`; and, with the `schema-check` feature and the official OpenAPI
//! document, the whole `CreateResponse` schema.

use std::path::Path;

use serde_json::Value;

use super::{Inner, RequestCheck};

/// The schema check for `CreateResponse` from the official OpenAPI document.
pub fn create_response_validator(openapi_json: &Path) -> Result<RequestCheck, String> {
    component_validator(openapi_json, "CreateResponse")
}

/// The schema check for one of the official OpenAPI document's component schemas (e.g.
/// `CreateResponse` for what we send, `Response` for what the fake answers).
#[cfg(feature = "schema-check")]
pub fn component_validator(openapi_json: &Path, component: &str) -> Result<RequestCheck, String> {
    use serde_json::json;
    use std::sync::Arc;
    let text = std::fs::read_to_string(openapi_json)
        .map_err(|e| format!("cannot read {}: {e}", openapi_json.display()))?;
    let mut doc: Value =
        serde_json::from_str(&text).map_err(|e| format!("invalid OpenAPI JSON: {e}"))?;
    if let Some(components) = doc.get_mut("components") {
        discriminated_one_of_to_any_of(components);
        errata(components);
    }
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": format!("#/components/schemas/{component}"),
        "components": doc.get("components").cloned().unwrap_or(Value::Null),
    });
    let validator = jsonschema::validator_for(&schema)
        .map_err(|e| format!("cannot compile {component}: {e}"))?;
    Ok(Arc::new(move |body: &Value| {
        match validator.iter_errors(body).next() {
            None => Ok(()),
            Some(err) => Err((err.to_string(), err.instance_path.to_string())),
        }
    }))
}

/// Without the `schema-check` feature there is no JSON Schema engine in the build.
#[cfg(not(feature = "schema-check"))]
pub fn component_validator(_openapi_json: &Path, _component: &str) -> Result<RequestCheck, String> {
    Err("this build has no JSON Schema engine: build with `--features schema-check` to check requests against the OpenAPI document".into())
}

/// Where the document contradicts itself and the live API: `MCPApprovalResponse` lists a
/// `request_id` among its required properties without defining it, and neither the API nor its
/// SDKs send or take one (an answer is `type`, `approval_request_id`, `approve`, and optionally
/// `id` and `reason`). The phantom requirement is dropped; everything else stays.
#[cfg_attr(not(feature = "schema-check"), allow(dead_code))]
fn errata(components: &mut Value) {
    if let Some(required) = components
        .pointer_mut("/schemas/MCPApprovalResponse/required")
        .and_then(Value::as_array_mut)
    {
        required.retain(|r| r != "request_id");
    }
}

/// OpenAPI resolves a `oneOf` that has a `discriminator` by the discriminator property; plain
/// JSON Schema does not, and the spec's input item alternatives overlap (a `user` message
/// matches both `EasyInputMessage` and `InputMessage`), so a literal `oneOf` rejects every
/// message. Reading those as `anyOf` keeps every real constraint of each alternative.
#[cfg_attr(not(feature = "schema-check"), allow(dead_code))]
fn discriminated_one_of_to_any_of(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if map.contains_key("discriminator")
                && let Some(alternatives) = map.remove("oneOf")
            {
                map.insert("anyOf".into(), alternatives);
            }
            map.values_mut().for_each(discriminated_one_of_to_any_of);
        }
        Value::Array(items) => items.iter_mut().for_each(discriminated_one_of_to_any_of),
        _ => {}
    }
}

pub(super) type Rejection = (String, Option<String>, Option<String>);

fn reject(message: impl Into<String>, param: &str) -> Rejection {
    (message.into(), Some(param.to_string()), None)
}

/// The checks the real API applies that matter to us; plus the full schema when loaded.
pub(super) fn check_request(inner: &Inner, req: &Value) -> Result<(), Rejection> {
    if let Some(check) = &inner.schema
        && let Err((err, path)) = check(req)
    {
        return Err(reject(format!("Invalid request: {err} at '{path}'"), &path));
    }
    if req.get("model").and_then(Value::as_str).is_none() {
        return Err(reject("Missing required parameter: 'model'.", "model"));
    }
    let items: &[Value] = match req.get("input") {
        Some(Value::String(_)) | None => &[],
        Some(Value::Array(a)) => a,
        Some(_) => return Err(reject("Invalid type for 'input'.", "input")),
    };
    let mut outputs: Vec<String> = Vec::new();
    let mut calls_in_input: Vec<String> = Vec::new();
    let (mut approval_requests, mut approval_answers) = (Vec::new(), Vec::new());
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        match item.get("type").and_then(Value::as_str) {
            Some("function_call_output") => {
                let id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| reject("Missing required parameter: 'call_id'.", &at))?;
                if !item
                    .get("output")
                    .is_some_and(|o| o.is_string() || o.is_array())
                {
                    return Err(reject("Missing required parameter: 'output'.", &at));
                }
                outputs.push(id.to_string());
            }
            Some("function_call") => {
                for k in ["call_id", "name", "arguments"] {
                    if item.get(k).and_then(Value::as_str).is_none() {
                        return Err(reject(
                            format!("Missing required parameter: '{at}.{k}'."),
                            &at,
                        ));
                    }
                }
                calls_in_input.push(item["call_id"].as_str().unwrap_or_default().to_string());
            }
            Some("message") | None => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("");
                if !matches!(role, "user" | "assistant" | "system" | "developer") {
                    return Err(reject(
                        format!("Invalid value for '{at}.role': {role:?}."),
                        &at,
                    ));
                }
                match item.get("content") {
                    Some(Value::String(_)) => {}
                    Some(Value::Array(parts)) => {
                        for (j, p) in parts.iter().enumerate() {
                            let pat = format!("{at}.content[{j}]");
                            let allowed: &[&str] = if role == "assistant" {
                                &["output_text", "refusal"]
                            } else {
                                &["input_text", "input_image", "input_file"]
                            };
                            let t = p.get("type").and_then(Value::as_str).unwrap_or("");
                            if !allowed.contains(&t) {
                                return Err(reject(
                                    format!(
                                        "Invalid value: '{t}'. Supported values are: {}.",
                                        allowed.join(", ")
                                    ),
                                    &format!("{pat}.type"),
                                ));
                            }
                            if t == "input_text" && p.get("text").and_then(Value::as_str).is_none()
                            {
                                return Err(reject("Missing required parameter: 'text'.", &pat));
                            }
                            if t == "input_image"
                                && p.get("image_url").and_then(Value::as_str).is_none()
                                && p.get("file_id").is_none()
                            {
                                return Err(reject(
                                    "Missing required parameter: 'image_url'.",
                                    &pat,
                                ));
                            }
                        }
                    }
                    _ => return Err(reject("Missing required parameter: 'content'.", &at)),
                }
            }
            Some(other) => {
                let asked_or_answered = (&mut approval_requests, &mut approval_answers);
                let known = super::hosted::check_item(item, other, &at, asked_or_answered)
                    .map_err(|(message, param)| reject(message, &param))?;
                if !known {
                    return Err(reject(
                        format!("Invalid value: '{other}'."),
                        &format!("{at}.type"),
                    ));
                }
            }
        }
    }
    let mut tool_names = Vec::new();
    if let Some(tools) = req.get("tools") {
        let tools = tools
            .as_array()
            .ok_or_else(|| reject("Invalid type for 'tools'.", "tools"))?;
        for (i, t) in tools.iter().enumerate() {
            let at = format!("tools[{i}]");
            match t.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(hosted) if super::hosted::is_hosted_tool(hosted) => {
                    super::hosted::check_tool(t, &at)
                        .map_err(|(message, param)| reject(message, &param))?;
                    continue;
                }
                _ => {
                    return Err(reject(
                        "Only function tools and the hosted web_search, file_search and mcp tools are supported by this fake.",
                        &format!("{at}.type"),
                    ));
                }
            }
            if t.get("function").is_some() {
                return Err(reject(
                    "Unknown parameter: 'tools[].function'. Function tools are flat in the Responses API.",
                    &at,
                ));
            }
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| reject("Missing required parameter: 'tools[].name'.", &at))?;
            if name.is_empty()
                || name.len() > 64
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(reject(
                    format!("Invalid 'tools[{i}].name': string does not match pattern."),
                    &at,
                ));
            }
            if t.get("strict").and_then(Value::as_bool) == Some(true)
                && let Some(params) = t.get("parameters")
            {
                strict_ok(params).map_err(|m| {
                    reject(
                        format!("Invalid schema for function '{name}': {m}"),
                        &format!("{at}.parameters"),
                    )
                })?;
            }
            tool_names.push(name.to_string());
        }
    }
    match req.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if matches!(s.as_str(), "none" | "auto" | "required") => {}
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").and_then(Value::as_str).unwrap_or("");
            if !tool_names.iter().any(|t| t == name) {
                return Err(reject(
                    format!("Tool choice '{name}' not found in 'tools' parameter."),
                    "tool_choice",
                ));
            }
        }
        Some(_) => return Err(reject("Invalid value for 'tool_choice'.", "tool_choice")),
    }
    // Function calls that must be answered: those of the previous response, or (replay) those
    // that appear in the input itself.
    let mut must_answer = calls_in_input;
    if let Some(prev) = req.get("previous_response_id").and_then(Value::as_str) {
        let stored = if inner.options.stateless {
            None
        } else {
            inner.stored.lock().ok().and_then(|s| s.get(prev).cloned())
        };
        match stored {
            Some(s) => {
                must_answer.extend(s.pending_calls);
                approval_requests.extend(
                    s.approvals
                        .iter()
                        .filter_map(|a| a["id"].as_str().map(str::to_string)),
                );
            }
            None => {
                return Err((
                    format!("Previous response with id '{prev}' not found."),
                    Some("previous_response_id".into()),
                    Some("previous_response_not_found".into()),
                ));
            }
        }
    }
    for call in &must_answer {
        if !outputs.contains(call) {
            return Err(reject(
                format!("No tool output found for function call {call}."),
                "input",
            ));
        }
    }
    if let Some(unknown) = approval_answers
        .iter()
        .find(|a| !approval_requests.contains(a))
    {
        return Err(reject(
            format!("No approval request found with id '{unknown}'."),
            "input",
        ));
    }
    for out in &outputs {
        if !must_answer.contains(out) {
            return Err(reject(
                format!("No tool call found for function call output with call_id {out}."),
                "input",
            ));
        }
    }
    Ok(())
}

fn strict_ok(schema: &Value) -> Result<(), String> {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(missing) = props.keys().find(|k| !required.contains(&k.as_str())) {
            return Err(format!(
                "'required' is required to be supplied and to be an array including every key in properties. Missing '{missing}'."
            ));
        }
        if schema.get("additionalProperties") != Some(&Value::Bool(false)) {
            return Err(
                "'additionalProperties' is required to be supplied and to be false.".into(),
            );
        }
        props.values().try_for_each(strict_ok)?;
    }
    Ok(())
}
