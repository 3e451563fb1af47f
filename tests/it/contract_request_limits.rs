//! Request limits, unknown fields, every violation at once, malformed bodies and the wire round
//! trip.

use super::contract_request::*;
use aptix_worker::contract::{AgentExecuteRequest, ErrorCode, RequestLimits, parse_request};
use serde_json::{Value, json};

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
