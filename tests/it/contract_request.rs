//! Table-driven tests of every AGN-034 rule: each rule has a passing and a failing case, and the
//! failing case asserts the exact error code and the field path that starts the message.

use aptix_worker::contract::request::{Encoding, Origin, RagOperator};
use aptix_worker::contract::{
    AgentExecuteRequest, ErrorCode, RequestLimits, ToolOutcome, parse_request,
};
use serde_json::{Value, json};

const PNG_B64: &str = "iVBORw0KGgo="; // 8 bytes of PNG signature

fn user_turn() -> Value {
    json!({"sessionId": "s-1", "turnId": "t-1", "instruction": "Summarise AGN-033."})
}

fn continuation() -> Value {
    json!({"sessionId": "s-1", "turnId": "t-1",
           "toolResults": [{"toolCallId": "call_1", "executionMs": 12, "resultJson": "{\"ok\":true}"}]})
}

fn artifact() -> Value {
    json!({"relativePath": "docs/AGN-033.md", "fileName": "AGN-033.md", "contents": "# AGN-033", "origin": "ide"})
}

fn with(mut base: Value, pointer: &str, value: Value) -> Value {
    set(&mut base, pointer, value);
    base
}

/// Sets (or, with `Value::Null` and a trailing `!`, removes) the field at a JSON pointer.
fn set(v: &mut Value, pointer: &str, value: Value) {
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

fn without(base: Value, pointer: &str) -> Value {
    with(base, &format!("{pointer}!"), Value::Null)
}

fn parse(v: &Value) -> Result<AgentExecuteRequest, Vec<(ErrorCode, String)>> {
    parse_with(v, &RequestLimits::default())
}

fn parse_with(
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
fn assert_ok(v: Value) -> AgentExecuteRequest {
    match parse(&v) {
        Ok(r) => r,
        Err(errors) => panic!("expected {v} to parse, got {errors:?}"),
    }
}

/// Asserts that parsing fails with exactly one error, with this code, whose message starts with
/// `path: `.
#[track_caller]
fn assert_err(v: Value, code: ErrorCode, path: &str) {
    assert_err_with(v, &RequestLimits::default(), code, path)
}

#[track_caller]
fn assert_err_with(v: Value, limits: &RequestLimits, code: ErrorCode, path: &str) {
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
fn a_minimal_user_turn_parses() {
    let AgentExecuteRequest::UserTurn(t) = assert_ok(user_turn()) else {
        panic!("expected a user turn")
    };
    assert_eq!(t.session_id().as_str(), "s-1");
    assert_eq!(t.turn_id().as_str(), "t-1");
    assert_eq!(t.instruction(), Some("Summarise AGN-033."));
    assert!(!t.streaming());
}

#[test]
fn session_and_turn_ids_are_required() {
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
fn ids_use_a_safe_charset_and_length() {
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
fn pascal_case_names_are_accepted_and_duplicates_rejected() {
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
fn a_user_turn_needs_an_input() {
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
fn server_owned_fields_are_forbidden_in_both_scenarios() {
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
fn a_continuation_carries_only_tool_results() {
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
fn tool_result_rules() {
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
fn artifact_rules() {
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
fn relative_paths_must_be_relative_and_contained() {
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
fn clipboard_image_rules() {
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
fn rag_condition_rules() {
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

#[test]
fn size_limits_are_errors_not_truncation() {
    let limits = RequestLimits {
        max_body_bytes: 4096,
        max_instruction_bytes: 10,
        max_artifact_bytes: 5,
        max_image_bytes: 8,
    };
    let ok = |v: Value| parse_with(&v, &limits).expect("within limits");
    ok(with(user_turn(), "/instruction", json!("0123456789")));
    assert_err_with(
        with(user_turn(), "/instruction", json!("0123456789A")),
        &limits,
        ErrorCode::PayloadTooLarge,
        "instruction",
    );
    let short = with(user_turn(), "/instruction", json!("go"));
    let art = with(short.clone(), "/inputArtifacts", json!([artifact()]));
    ok(with(
        art.clone(),
        "/inputArtifacts/0/contents",
        json!("12345"),
    ));
    assert_err_with(
        with(art.clone(), "/inputArtifacts/0/contents", json!("123456")),
        &limits,
        ErrorCode::PayloadTooLarge,
        "inputArtifacts[0].contents",
    );
    // base64 artifacts are measured after decoding: 8 base64 chars = 6 bytes
    let b64 = with(art, "/inputArtifacts/0/encoding", json!("base64"));
    ok(with(
        b64.clone(),
        "/inputArtifacts/0/contents",
        json!("aGVsbG8="),
    ));
    assert_err_with(
        with(b64, "/inputArtifacts/0/contents", json!("aGVsbG8h")),
        &limits,
        ErrorCode::PayloadTooLarge,
        "inputArtifacts[0].contents",
    );
    let img = with(
        short,
        "/clipboardImages",
        json!([{"id": "i", "mimeType": "image/png", "dataBase64": PNG_B64}]),
    );
    ok(img.clone());
    assert_err_with(
        with(img, "/clipboardImages/0/dataBase64", json!("iVBORw0KGgoA")),
        &limits,
        ErrorCode::PayloadTooLarge,
        "clipboardImages[0].dataBase64",
    );
    // the body limit is checked before anything else
    let big = with(user_turn(), "/solutionContextText", json!("x".repeat(5000)));
    let rejected = parse_request(big.to_string().as_bytes(), &limits).unwrap_err();
    assert!(rejected.is_body_too_large());
    assert_eq!(rejected.errors[0].error_code, ErrorCode::PayloadTooLarge);
    assert!(rejected.errors[0].message.starts_with("$: "));
    let small = parse_request(
        with(user_turn(), "/instruction", json!("go"))
            .to_string()
            .as_bytes(),
        &limits,
    );
    assert!(small.is_ok());
}

#[test]
fn unknown_fields_are_ignored_with_a_warning() {
    let v = with(
        with(user_turn(), "/conversationId", json!("old")),
        "/inputArtifacts",
        json!([with(artifact(), "/sha", json!("abc"))]),
    );
    let parsed =
        parse_request(v.to_string().as_bytes(), &RequestLimits::default()).expect("parses");
    let warnings: Vec<(ErrorCode, &str)> = parsed
        .warnings
        .iter()
        .map(|w| (w.error_code, w.message.as_str()))
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings.iter().all(|(c, _)| *c == ErrorCode::UnknownField));
    assert!(
        warnings
            .iter()
            .any(|(_, m)| m.starts_with("conversationId: "))
    );
    assert!(
        warnings
            .iter()
            .any(|(_, m)| m.starts_with("inputArtifacts[0].sha: "))
    );
    let clean = parse_request(
        user_turn().to_string().as_bytes(),
        &RequestLimits::default(),
    )
    .unwrap();
    assert!(clean.warnings.is_empty());
}

#[test]
fn every_violation_is_reported_not_just_the_first() {
    let v = json!({"sessionId": "bad id", "mode": "general", "inputArtifacts": [{"relativePath": "/abs", "fileName": "f", "contents": "c", "origin": "disk"}],
                   "ragScope": {"conditions": [{"key": "", "operator": "~", "values": []}]}});
    let errors = parse(&v).unwrap_err();
    let codes: Vec<ErrorCode> = errors.iter().map(|e| e.0).collect();
    for expected in [
        ErrorCode::InvalidId,
        ErrorCode::MissingField,
        ErrorCode::ForbiddenField,
        ErrorCode::InvalidPath,
        ErrorCode::InvalidArtifact,
        ErrorCode::InvalidRagCondition,
    ] {
        assert!(
            codes.contains(&expected),
            "{expected} missing from {errors:?}"
        );
    }
    assert_eq!(
        codes
            .iter()
            .filter(|c| **c == ErrorCode::InvalidRagCondition)
            .count(),
        3,
        "{errors:?}"
    );
}

#[test]
fn bodies_that_are_not_json_objects_are_malformed() {
    for body in [&b"{"[..], b"", b"[]", b"42", b"\"x\"", b"\xff\xfe"] {
        let rejected = parse_request(body, &RequestLimits::default()).unwrap_err();
        assert_eq!(rejected.errors.len(), 1);
        assert_eq!(rejected.errors[0].error_code, ErrorCode::MalformedJson);
        assert!(rejected.errors[0].message.starts_with("$: "));
    }
}

#[test]
fn a_byte_order_mark_before_the_body_is_skipped_and_anywhere_else_is_malformed() {
    let body = serde_json::to_vec(&user_turn()).unwrap();
    let with_bom = [&b"\xEF\xBB\xBF"[..], &body].concat();
    let parsed =
        parse_request(&with_bom, &RequestLimits::default()).expect("a leading BOM is skipped");
    assert_eq!(parsed.request.session_id().as_str(), "s-1");
    // After whitespace, or twice, it is no longer the text's first character: not JSON.
    for bad in [
        [&b" \xEF\xBB\xBF"[..], &body].concat(),
        [&b"\xEF\xBB\xBF\xEF\xBB\xBF"[..], &body].concat(),
    ] {
        let rejected = parse_request(&bad, &RequestLimits::default()).unwrap_err();
        assert_eq!(rejected.errors[0].error_code, ErrorCode::MalformedJson);
    }
    // Inside a string it is content, kept as sent.
    let inside = with(user_turn(), "/instruction", json!("\u{feff}hello"));
    let AgentExecuteRequest::UserTurn(turn) = assert_ok(inside) else {
        panic!("a user turn");
    };
    assert_eq!(turn.instruction(), Some("\u{feff}hello"));
}

#[test]
fn rejected_requests_become_failed_invoke_results() {
    let rejected = parse_request(b"{}", &RequestLimits::default()).unwrap_err();
    let result: aptix_worker::contract::InvokeResult<()> = rejected.into_invoke_result();
    let json = serde_json::to_value(&result).unwrap();
    assert_eq!(json["successful"], json!(false));
    assert!(json.get("result").is_none());
    assert_eq!(json["errors"].as_array().unwrap().len(), 3, "{json}");
}

#[test]
fn valid_requests_round_trip_through_their_wire_form() {
    let full = json!({"sessionId": "s", "turnId": "t", "instruction": "i",
        "inputArtifacts": [with(artifact(), "/language", json!("markdown"))],
        "clipboardImages": [{"id": "i1", "mimeType": "image/png", "dataBase64": PNG_B64}],
        "ragScope": {"conditions": [{"key": "docId", "operator": "contains", "values": ["AGN"]}]},
        "solutionContextText": "ctx", "workspaceId": "w", "repo": "r", "language": "rust", "streaming": true,
        "agentContextId": "default", "conversationContextId": "default"});
    for v in [full, continuation()] {
        let first = assert_ok(v);
        let again = assert_ok(serde_json::to_value(&first).unwrap());
        assert_eq!(first, again);
    }
}
