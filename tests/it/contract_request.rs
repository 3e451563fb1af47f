//! Table-driven tests of every AGN-034 rule: each rule has a passing and a failing case, and the
//! failing case asserts the exact error code and the field path that starts the message.

use aptix_worker::contract::request::{Encoding, Origin, RagOperator};
use aptix_worker::contract::{
    AgentExecuteRequest, ErrorCode, RequestLimits, ToolOutcome, parse_request,
};
use serde_json::{Value, json};

pub(super) const PNG_B64: &str = "iVBORw0KGgo="; // 8 bytes of PNG signature

pub(super) fn user_turn() -> Value {
    json!({"sessionId": "s-1", "turnId": "t-1", "instruction": "Summarise AGN-033."})
}

pub(super) fn continuation() -> Value {
    json!({"sessionId": "s-1", "turnId": "t-1",
           "toolResults": [{"toolCallId": "call_1", "executionMs": 12, "resultJson": "{\"ok\":true}"}]})
}

pub(super) fn artifact() -> Value {
    json!({"relativePath": "docs/AGN-033.md", "fileName": "AGN-033.md", "contents": "# AGN-033", "origin": "ide"})
}

pub(super) fn with(mut base: Value, pointer: &str, value: Value) -> Value {
    set(&mut base, pointer, value);
    base
}

/// Sets (or, with `Value::Null` and a trailing `!`, removes) the field at a JSON pointer.
pub(super) fn set(v: &mut Value, pointer: &str, value: Value) {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer");
    let target = if parent.is_empty() {
        v
    } else {
        v.pointer_mut(parent).expect("parent exists")
    };
    if let Some(key) = key.strip_suffix('!') {
        target.as_object_mut().expect("object").remove(key);
    } else if let Some(obj) = target.as_object_mut() {
        obj.insert(key.to_string(), value);
    } else if let Some(arr) = target.as_array_mut() {
        arr[key.parse::<usize>().expect("index")] = value;
    }
}

pub(super) fn without(base: Value, pointer: &str) -> Value {
    with(base, &format!("{pointer}!"), Value::Null)
}

pub(super) fn parse(v: &Value) -> Result<AgentExecuteRequest, Vec<(ErrorCode, String)>> {
    parse_with(v, &RequestLimits::default())
}

pub(super) fn parse_with(
    v: &Value,
    limits: &RequestLimits,
) -> Result<AgentExecuteRequest, Vec<(ErrorCode, String)>> {
    parse_request(v.to_string().as_bytes(), limits)
        .map(|p| p.request)
        .map_err(|r| {
            r.errors
                .into_iter()
                .map(|e| (e.error_code, e.message))
                .collect()
        })
}

#[track_caller]
pub(super) fn assert_ok(v: Value) -> AgentExecuteRequest {
    match parse(&v) {
        Ok(r) => r,
        Err(errors) => panic!("expected {v} to parse, got {errors:?}"),
    }
}

/// Asserts that parsing fails with exactly one error, with this code, whose message starts with
/// `path: `.
#[track_caller]
pub(super) fn assert_err(v: Value, code: ErrorCode, path: &str) {
    assert_err_with(v, &RequestLimits::default(), code, path)
}

#[track_caller]
pub(super) fn assert_err_with(v: Value, limits: &RequestLimits, code: ErrorCode, path: &str) {
    match parse_with(&v, limits) {
        Ok(r) => panic!("expected {v} to fail with {code}, it parsed as {r:?}"),
        Err(errors) => {
            assert_eq!(
                errors.len(),
                1,
                "expected one error for {v}, got {errors:?}"
            );
            assert_eq!(errors[0].0, code, "wrong code for {v}: {errors:?}");
            assert!(
                errors[0].1.starts_with(&format!("{path}: ")),
                "message {:?} should start with {path:?}",
                errors[0].1
            );
        }
    }
}

#[test]
pub(super) fn a_minimal_user_turn_parses() {
    let AgentExecuteRequest::UserTurn(t) = assert_ok(user_turn()) else {
        panic!("expected a user turn")
    };
    assert_eq!(t.session_id().as_str(), "s-1");
    assert_eq!(t.turn_id().as_str(), "t-1");
    assert_eq!(t.instruction(), Some("Summarise AGN-033."));
    assert!(!t.streaming());
}

#[test]
pub(super) fn session_and_turn_ids_are_required() {
    assert_err(
        without(user_turn(), "/sessionId"),
        ErrorCode::MissingField,
        "sessionId",
    );
    assert_err(
        without(user_turn(), "/turnId"),
        ErrorCode::MissingField,
        "turnId",
    );
    assert_err(
        without(continuation(), "/turnId"),
        ErrorCode::MissingField,
        "turnId",
    );
    assert_err(
        with(user_turn(), "/sessionId", json!(null)),
        ErrorCode::MissingField,
        "sessionId",
    );
    assert_err(
        with(user_turn(), "/sessionId", json!(7)),
        ErrorCode::InvalidFieldType,
        "sessionId",
    );
}

#[test]
pub(super) fn ids_use_a_safe_charset_and_length() {
    for ok in ["a", "A.b_c:d-9", &"x".repeat(128)] {
        assert_ok(with(user_turn(), "/sessionId", json!(ok)));
        assert_ok(with(user_turn(), "/turnId", json!(ok)));
        assert_ok(with(continuation(), "/toolResults/0/toolCallId", json!(ok)));
    }
    for bad in ["", "a b", "a/b", "a{b}", "ü", "a*", &"x".repeat(129)] {
        assert_err(
            with(user_turn(), "/sessionId", json!(bad)),
            ErrorCode::InvalidId,
            "sessionId",
        );
        assert_err(
            with(user_turn(), "/turnId", json!(bad)),
            ErrorCode::InvalidId,
            "turnId",
        );
        assert_err(
            with(continuation(), "/toolResults/0/toolCallId", json!(bad)),
            ErrorCode::InvalidId,
            "toolResults[0].toolCallId",
        );
    }
    assert_ok(with(user_turn(), "/agentContextId", json!("default")));
    assert_err(
        with(user_turn(), "/agentContextId", json!("no spaces")),
        ErrorCode::InvalidId,
        "agentContextId",
    );
}

#[test]
pub(super) fn pascal_case_names_are_accepted_and_duplicates_rejected() {
    let pascal = json!({"SessionId": "s", "TurnId": "t", "Instruction": "hi",
                        "InputArtifacts": [{"RelativePath": "a.md", "FileName": "a.md", "Contents": "x", "Origin": "user"}]});
    let AgentExecuteRequest::UserTurn(t) = assert_ok(pascal) else {
        panic!()
    };
    assert_eq!(t.input_artifacts()[0].origin(), Origin::User);
    assert_err(
        with(user_turn(), "/SessionId", json!("other")),
        ErrorCode::DuplicateField,
        "sessionId",
    );
}

#[test]
pub(super) fn a_user_turn_needs_an_input() {
    let bare = json!({"sessionId": "s", "turnId": "t"});
    assert_err(bare.clone(), ErrorCode::EmptyTurn, "$");
    assert_err(
        with(bare.clone(), "/instruction", json!("   ")),
        ErrorCode::EmptyTurn,
        "$",
    );
    assert_err(
        with(bare.clone(), "/inputArtifacts", json!([])),
        ErrorCode::EmptyTurn,
        "$",
    );
    assert_ok(with(bare.clone(), "/instruction", json!("go")));
    assert_ok(with(bare.clone(), "/inputArtifacts", json!([artifact()])));
    assert_ok(with(
        bare,
        "/clipboardImages",
        json!([{"id": "img1", "mimeType": "image/png", "dataBase64": PNG_B64}]),
    ));
}

#[test]
pub(super) fn server_owned_fields_are_forbidden_in_both_scenarios() {
    for field in [
        "mode",
        "Mode",
        "responseContinuationId",
        "previousResponseId",
        "toolsJson",
        "tools",
        "toolChoiceName",
    ] {
        let camel = {
            let mut c = field.chars();
            let f = c.next().unwrap().to_ascii_lowercase();
            format!("{f}{}", c.as_str())
        };
        assert_err(
            with(user_turn(), &format!("/{field}"), json!("x")),
            ErrorCode::ForbiddenField,
            &camel,
        );
        assert_err(
            with(continuation(), &format!("/{field}"), json!("x")),
            ErrorCode::ForbiddenField,
            &camel,
        );
    }
    // A null is "absent" and therefore carries nothing forbidden.
    assert_ok(with(user_turn(), "/mode", json!(null)));
}

#[test]
pub(super) fn a_continuation_carries_only_tool_results() {
    let AgentExecuteRequest::ToolContinuation(c) = assert_ok(continuation()) else {
        panic!()
    };
    assert_eq!(c.tool_results().len(), 1);
    assert_eq!(c.tool_results()[0].execution_ms, 12);
    for (field, value) in [
        ("instruction", json!("more")),
        ("inputArtifacts", json!([artifact()])),
        ("clipboardImages", json!([])),
        ("ragScope", json!({"conditions": []})),
        ("solutionContextText", json!("ctx")),
        ("workspaceId", json!("w")),
        ("repo", json!("r")),
        ("language", json!("rust")),
        ("streaming", json!(false)),
        ("agentContextId", json!("a")),
        ("conversationContextId", json!("c")),
    ] {
        assert_err(
            with(continuation(), &format!("/{field}"), value),
            ErrorCode::ForbiddenField,
            field,
        );
    }
    assert_err(
        with(continuation(), "/toolResults", json!([])),
        ErrorCode::InvalidToolResult,
        "toolResults",
    );
    assert_err(
        with(continuation(), "/toolResults", json!("x")),
        ErrorCode::InvalidFieldType,
        "toolResults",
    );
}

#[test]
pub(super) fn tool_result_rules() {
    let p = "toolResults[0]";
    let tr = "/toolResults/0";
    assert_err(
        without(continuation(), &format!("{tr}/toolCallId")),
        ErrorCode::MissingField,
        &format!("{p}.toolCallId"),
    );
    assert_err(
        without(continuation(), &format!("{tr}/executionMs")),
        ErrorCode::MissingField,
        &format!("{p}.executionMs"),
    );
    assert_ok(with(continuation(), &format!("{tr}/executionMs"), json!(0)));
    assert_err(
        with(continuation(), &format!("{tr}/executionMs"), json!(-1)),
        ErrorCode::InvalidToolResult,
        &format!("{p}.executionMs"),
    );
    assert_err(
        with(continuation(), &format!("{tr}/executionMs"), json!(1.5)),
        ErrorCode::InvalidToolResult,
        &format!("{p}.executionMs"),
    );
    assert_err(
        with(continuation(), &format!("{tr}/executionMs"), json!("5")),
        ErrorCode::InvalidFieldType,
        &format!("{p}.executionMs"),
    );
    // exactly one of resultJson / errorMessage
    assert_err(
        with(continuation(), &format!("{tr}/errorMessage"), json!("boom")),
        ErrorCode::InvalidToolResult,
        p,
    );
    assert_err(
        without(continuation(), &format!("{tr}/resultJson")),
        ErrorCode::InvalidToolResult,
        p,
    );
    let failed = with(
        without(continuation(), &format!("{tr}/resultJson")),
        &format!("{tr}/errorMessage"),
        json!("file not found"),
    );
    let AgentExecuteRequest::ToolContinuation(c) = assert_ok(failed) else {
        panic!()
    };
    assert_eq!(
        c.tool_results()[0].outcome,
        ToolOutcome::Error("file not found".into())
    );
    // resultJson must itself be JSON
    assert_err(
        with(
            continuation(),
            &format!("{tr}/resultJson"),
            json!("{not json"),
        ),
        ErrorCode::InvalidResultJson,
        &format!("{p}.resultJson"),
    );
    assert_ok(with(
        continuation(),
        &format!("{tr}/resultJson"),
        json!("\"a string is JSON\""),
    ));
    assert_err(
        with(
            continuation(),
            &format!("{tr}/resultJson"),
            json!({"ok": true}),
        ),
        ErrorCode::InvalidFieldType,
        &format!("{p}.resultJson"),
    );
}

#[test]
pub(super) fn artifact_rules() {
    let a = "/inputArtifacts/0";
    let p = "inputArtifacts[0]";
    let base = with(user_turn(), "/inputArtifacts", json!([artifact()]));
    assert_ok(base.clone());
    for field in ["relativePath", "fileName", "contents", "origin"] {
        assert_err(
            without(base.clone(), &format!("{a}/{field}")),
            ErrorCode::MissingField,
            &format!("{p}.{field}"),
        );
    }
    assert_ok(with(base.clone(), &format!("{a}/origin"), json!("user")));
    assert_err(
        with(base.clone(), &format!("{a}/origin"), json!("disk")),
        ErrorCode::InvalidArtifact,
        &format!("{p}.origin"),
    );
    let AgentExecuteRequest::UserTurn(t) = assert_ok(base.clone()) else {
        panic!()
    };
    assert_eq!(
        t.input_artifacts()[0].encoding(),
        Encoding::Utf8,
        "utf8 is the default"
    );
    assert_ok(with(base.clone(), &format!("{a}/encoding"), json!("utf8")));
    assert_err(
        with(base.clone(), &format!("{a}/encoding"), json!("latin1")),
        ErrorCode::InvalidArtifact,
        &format!("{p}.encoding"),
    );
    let b64 = with(
        with(base.clone(), &format!("{a}/encoding"), json!("base64")),
        &format!("{a}/contents"),
        json!("aGVsbG8="),
    );
    let AgentExecuteRequest::UserTurn(t) = assert_ok(b64.clone()) else {
        panic!()
    };
    assert_eq!(t.input_artifacts()[0].decoded(), b"hello");
    assert_err(
        with(b64, &format!("{a}/contents"), json!("not base64!")),
        ErrorCode::InvalidArtifact,
        &format!("{p}.contents"),
    );
}

#[test]
pub(super) fn relative_paths_must_be_relative_and_contained() {
    let a = "/inputArtifacts/0/relativePath";
    let base = with(user_turn(), "/inputArtifacts", json!([artifact()]));
    for ok in [
        "README.md",
        "src/main.rs",
        "docs\\AGN-002.md",
        "a..b/c.md",
        "./x.md",
    ] {
        assert_ok(with(base.clone(), a, json!(ok)));
    }
    for bad in [
        "",
        "/etc/passwd",
        "\\Windows\\x",
        "\\\\server\\share\\f",
        "C:\\x.md",
        "c:x",
        "a/../b",
        "..\\x",
        "..",
        "a\u{0}b",
    ] {
        assert_err(
            with(base.clone(), a, json!(bad)),
            ErrorCode::InvalidPath,
            "inputArtifacts[0].relativePath",
        );
    }
}

#[test]
pub(super) fn clipboard_image_rules() {
    let i = "/clipboardImages/0";
    let p = "clipboardImages[0]";
    let base = with(
        user_turn(),
        "/clipboardImages",
        json!([{"id": "img1", "mimeType": "image/png", "dataBase64": PNG_B64}]),
    );
    let AgentExecuteRequest::UserTurn(t) = assert_ok(base.clone()) else {
        panic!()
    };
    assert_eq!(
        t.clipboard_images()[0].data_url(),
        format!("data:image/png;base64,{PNG_B64}")
    );
    assert_err(
        with(base.clone(), &format!("{i}/id"), json!("")),
        ErrorCode::InvalidImage,
        &format!("{p}.id"),
    );
    assert_err(
        without(base.clone(), &format!("{i}/id")),
        ErrorCode::MissingField,
        &format!("{p}.id"),
    );
    assert_ok(with(
        base.clone(),
        &format!("{i}/mimeType"),
        json!("image/jpeg"),
    ));
    for bad in ["text/plain", "image/", "png", "application/image/png"] {
        assert_err(
            with(base.clone(), &format!("{i}/mimeType"), json!(bad)),
            ErrorCode::InvalidImage,
            &format!("{p}.mimeType"),
        );
    }
    assert_err(
        with(base.clone(), &format!("{i}/dataBase64"), json!("%%%")),
        ErrorCode::InvalidImage,
        &format!("{p}.dataBase64"),
    );
    assert_err(
        with(base, &format!("{i}/dataBase64"), json!("")),
        ErrorCode::InvalidImage,
        &format!("{p}.dataBase64"),
    );
}

#[test]
pub(super) fn rag_condition_rules() {
    let c = "/ragScope/conditions/0";
    let p = "ragScope.conditions[0]";
    let base = with(
        user_turn(),
        "/ragScope",
        json!({"conditions": [{"key": "docId", "operator": "==", "values": ["AGN-033"]}]}),
    );
    for (op, expected) in [
        ("==", RagOperator::Equals),
        ("!=", RagOperator::NotEquals),
        ("contains", RagOperator::Contains),
        ("does_not_contain", RagOperator::DoesNotContain),
    ] {
        let AgentExecuteRequest::UserTurn(t) =
            assert_ok(with(base.clone(), &format!("{c}/operator"), json!(op)))
        else {
            panic!()
        };
        assert_eq!(t.rag_scope().unwrap().conditions[0].operator, expected);
    }
    assert_err(
        with(base.clone(), &format!("{c}/operator"), json!("like")),
        ErrorCode::InvalidRagCondition,
        &format!("{p}.operator"),
    );
    assert_err(
        with(base.clone(), &format!("{c}/key"), json!("")),
        ErrorCode::InvalidRagCondition,
        &format!("{p}.key"),
    );
    assert_err(
        with(base.clone(), &format!("{c}/values"), json!([])),
        ErrorCode::InvalidRagCondition,
        &format!("{p}.values"),
    );
    assert_err(
        without(base.clone(), &format!("{c}/values")),
        ErrorCode::MissingField,
        &format!("{p}.values"),
    );
    assert_err(
        with(base.clone(), &format!("{c}/values"), json!([1])),
        ErrorCode::InvalidFieldType,
        &format!("{p}.values[0]"),
    );
    assert_err(
        without(base, "/ragScope/conditions"),
        ErrorCode::MissingField,
        "ragScope.conditions",
    );
}
