//! The parser's items: tool results, input artifacts, clipboard images and the `ragScope`
//! conditions, each checked field by field with every violation reported.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value};

use super::fields::{Fields, Report, kind_of, parse_list};
use super::{
    ClipboardImage, Encoding, InputArtifact, JsonText, Origin, RAG_KEYS, RagCondition, RagOperator,
    RagScope, RelativePath, RequestLimits, ToolOutcome, ToolResult,
};
use crate::contract::codes::ErrorCode;
use crate::contract::ids::ToolCallId;

pub(super) fn parse_tool_results(
    fields: &Fields<'_>,
    report: &mut Report,
) -> Option<Vec<ToolResult>> {
    let items = fields.array("toolResults", report)?;
    if items.is_empty() {
        report.error(
            ErrorCode::InvalidToolResult,
            "toolResults",
            "must hold at least one tool result",
        );
        return None;
    }
    parse_list(items, "toolResults", report, parse_tool_result)
}

pub(super) fn parse_tool_result(
    map: &Map<String, Value>,
    path: &str,
    report: &mut Report,
) -> Option<ToolResult> {
    let f = Fields::collect(
        map,
        path,
        &["toolCallId", "executionMs", "resultJson", "errorMessage"],
        &[],
        report,
    );
    let tool_call_id = f.id("toolCallId", |s| ToolCallId::parse(s), report);
    let execution_ms = match f.get("executionMs") {
        None => {
            report.error(
                ErrorCode::MissingField,
                &f.path("executionMs"),
                "is required",
            );
            None
        }
        // A whole number written with a fraction (`12.0`) is still a whole number.
        Some(Value::Number(n)) => match n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        }) {
            Some(ms) => Some(ms),
            None => {
                report.error(
                    ErrorCode::InvalidToolResult,
                    &f.path("executionMs"),
                    format!("must be a whole number of milliseconds >= 0 (got {n})"),
                );
                None
            }
        },
        Some(other) => {
            report.error(
                ErrorCode::InvalidFieldType,
                &f.path("executionMs"),
                format!("must be a number, not {}", kind_of(other)),
            );
            None
        }
    };
    let outcome = match (f.has("resultJson"), f.has("errorMessage")) {
        (true, true) => {
            report.error(
                ErrorCode::InvalidToolResult,
                path,
                "must carry exactly one of resultJson or errorMessage, not both",
            );
            None
        }
        (false, false) => {
            report.error(
                ErrorCode::InvalidToolResult,
                path,
                "must carry exactly one of resultJson or errorMessage",
            );
            None
        }
        (true, false) => f
            .string("resultJson", report)
            .and_then(|s| match JsonText::parse(s) {
                Ok(j) => Some(ToolOutcome::Result(j)),
                Err(e) => {
                    report.error(
                        ErrorCode::InvalidResultJson,
                        &f.path("resultJson"),
                        format!("is not valid JSON ({e})"),
                    );
                    None
                }
            }),
        (false, true) => f
            .string("errorMessage", report)
            .map(|s| ToolOutcome::Error(s.to_string())),
    };
    Some(ToolResult {
        tool_call_id: tool_call_id?,
        execution_ms: execution_ms?,
        outcome: outcome?,
    })
}

pub(super) fn parse_artifact(
    map: &Map<String, Value>,
    path: &str,
    limits: &RequestLimits,
    report: &mut Report,
) -> Option<InputArtifact> {
    let f = Fields::collect(
        map,
        path,
        &[
            "relativePath",
            "fileName",
            "contents",
            "origin",
            "mimeType",
            "language",
            "encoding",
        ],
        &[],
        report,
    );
    let relative_path =
        f.required_string("relativePath", report)
            .and_then(|s| match RelativePath::parse(s) {
                Ok(p) => Some(p),
                Err(why) => {
                    report.error(ErrorCode::InvalidPath, &f.path("relativePath"), why);
                    None
                }
            });
    let file_name = f.required_string("fileName", report);
    let contents = f.required_string("contents", report);
    let origin = f.required_string("origin", report).and_then(|s| match s {
        "ide" => Some(Origin::Ide),
        "user" => Some(Origin::User),
        other => {
            report.error(
                ErrorCode::InvalidArtifact,
                &f.path("origin"),
                format!("must be \"ide\" or \"user\" (got {other:?})"),
            );
            None
        }
    });
    let mut encoding_ok = true;
    let encoding = match f.string("encoding", report) {
        None => Encoding::Utf8,
        Some("utf8") => Encoding::Utf8,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            report.error(
                ErrorCode::InvalidArtifact,
                &f.path("encoding"),
                format!("must be \"utf8\" or \"base64\" (got {other:?})"),
            );
            encoding_ok = false;
            Encoding::Utf8
        }
    };
    let mut contents_ok = encoding_ok;
    if let (Some(text), true) = (contents, encoding_ok) {
        let size = match encoding {
            Encoding::Utf8 => Some(text.len()),
            Encoding::Base64 => match BASE64.decode(text) {
                Ok(bytes) => Some(bytes.len()),
                Err(e) => {
                    report.error(
                        ErrorCode::InvalidArtifact,
                        &f.path("contents"),
                        format!("is not valid base64 ({e})"),
                    );
                    None
                }
            },
        };
        match size {
            Some(n) if n > limits.max_artifact_bytes => {
                report.error(
                    ErrorCode::PayloadTooLarge,
                    &f.path("contents"),
                    format!(
                        "is {n} bytes; the limit per artifact is {} bytes",
                        limits.max_artifact_bytes
                    ),
                );
                contents_ok = false;
            }
            Some(_) => {}
            None => contents_ok = false,
        }
    }
    let mime_type = f.string("mimeType", report).map(str::to_string);
    let language = f.string("language", report).map(str::to_string);
    if !contents_ok {
        return None;
    }
    Some(InputArtifact {
        relative_path: relative_path?,
        file_name: file_name?.to_string(),
        contents: contents?.to_string(),
        origin: origin?,
        mime_type,
        language,
        encoding,
    })
}

pub(super) fn parse_image(
    map: &Map<String, Value>,
    path: &str,
    limits: &RequestLimits,
    report: &mut Report,
) -> Option<ClipboardImage> {
    let f = Fields::collect(map, path, &["id", "mimeType", "dataBase64"], &[], report);
    let id = f.required_string("id", report).and_then(|s| {
        if s.trim().is_empty() {
            report.error(ErrorCode::InvalidImage, &f.path("id"), "must not be empty");
            None
        } else {
            Some(s.to_string())
        }
    });
    let mime_type = f.required_string("mimeType", report).and_then(|s| {
        // `image/` and a subtype name as RFC 6838 restricts them.
        let valid = s.strip_prefix("image/").is_some_and(|sub| {
            let mut chars = sub.chars();
            sub.len() <= 127
                && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
                && chars.all(|c| c.is_ascii_alphanumeric() || "!#$&^_.+-".contains(c))
        });
        if valid {
            Some(s.to_string())
        } else {
            report.error(
                ErrorCode::InvalidImage,
                &f.path("mimeType"),
                format!("must be an image/* MIME type (got {s:?})"),
            );
            None
        }
    });
    let data = f
        .required_string("dataBase64", report)
        .and_then(|s| match BASE64.decode(s) {
            Ok(bytes) if bytes.is_empty() => {
                report.error(
                    ErrorCode::InvalidImage,
                    &f.path("dataBase64"),
                    "must not be empty",
                );
                None
            }
            Ok(bytes) if bytes.len() > limits.max_image_bytes => {
                report.error(
                    ErrorCode::PayloadTooLarge,
                    &f.path("dataBase64"),
                    format!(
                        "decodes to {} bytes; the limit per image is {} bytes",
                        bytes.len(),
                        limits.max_image_bytes
                    ),
                );
                None
            }
            Ok(_) => Some(s.to_string()),
            Err(e) => {
                report.error(
                    ErrorCode::InvalidImage,
                    &f.path("dataBase64"),
                    format!("is not valid base64 ({e})"),
                );
                None
            }
        });
    Some(ClipboardImage {
        id: id?,
        mime_type: mime_type?,
        data_base64: data?,
    })
}

pub(super) fn parse_rag_scope(
    map: &Map<String, Value>,
    path: &str,
    report: &mut Report,
) -> Option<RagScope> {
    let f = Fields::collect(map, path, &["conditions"], &[], report);
    let Some(items) = f.array("conditions", report) else {
        if !f.has("conditions") {
            report.error(
                ErrorCode::MissingField,
                &f.path("conditions"),
                "is required",
            );
        }
        return None;
    };
    let conditions = parse_list(items, &f.path("conditions"), report, parse_condition)?;
    Some(RagScope { conditions })
}

pub(super) fn parse_condition(
    map: &Map<String, Value>,
    path: &str,
    report: &mut Report,
) -> Option<RagCondition> {
    let f = Fields::collect(map, path, &["key", "operator", "values"], &[], report);
    let key = f.required_string("key", report).and_then(|k| {
        if k.trim().is_empty() {
            report.error(
                ErrorCode::InvalidRagCondition,
                &f.path("key"),
                "must not be empty",
            );
            None
        } else {
            if !RAG_KEYS.contains(&k) {
                report.warn(
                    ErrorCode::UnknownRagKey,
                    &f.path("key"),
                    format!(
                        "{k:?} is not a chunk metadata key ({}); the condition is ignored",
                        RAG_KEYS.join(", ")
                    ),
                );
            }
            Some(k.to_string())
        }
    });
    let operator = f.required_string("operator", report).and_then(|op| {
        let parsed = RagOperator::parse(op);
        if parsed.is_none() {
            report.error(
                ErrorCode::InvalidRagCondition,
                &f.path("operator"),
                format!("must be one of ==, !=, contains, does_not_contain (got {op:?})"),
            );
        }
        parsed
    });
    let values = match f.array("values", report) {
        None => {
            if !f.has("values") {
                report.error(ErrorCode::MissingField, &f.path("values"), "is required");
            }
            None
        }
        Some(vs) if vs.is_empty() => {
            report.error(
                ErrorCode::InvalidRagCondition,
                &f.path("values"),
                "must hold at least one value",
            );
            None
        }
        Some(vs) => {
            let mut out = Vec::with_capacity(vs.len());
            for (i, v) in vs.iter().enumerate() {
                match v.as_str() {
                    Some(s) => out.push(s.to_string()),
                    None => report.error(
                        ErrorCode::InvalidFieldType,
                        &format!("{}[{i}]", f.path("values")),
                        format!("must be a string, not {}", kind_of(v)),
                    ),
                }
            }
            (out.len() == vs.len()).then_some(out)
        }
    };
    Some(RagCondition {
        key: key?,
        operator: operator?,
        values: values?,
    })
}
