//! Property tests: the parser never panics, on arbitrary JSON or arbitrary bytes, and always
//! answers with either a valid request or at least one error.

use aptix_worker::contract::{RequestLimits, parse_request};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Field names the parser knows (both spellings) mixed with random ones, so generated objects
/// reach deep into the parser instead of stopping at "unknown field".
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "sessionId", "SessionId", "turnId", "TurnId", "instruction", "inputArtifacts",
            "clipboardImages", "ragScope", "conditions", "key", "operator", "values", "toolResults",
            "toolCallId", "executionMs", "resultJson", "errorMessage", "relativePath", "fileName",
            "contents", "origin", "encoding", "mimeType", "id", "dataBase64", "mode", "streaming",
            "agentContextId",
        ]).prop_map(str::to_string),
        1 => "[a-zA-Z]{0,8}",
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(vec![
            "s",
            "t-1",
            "",
            "ide",
            "user",
            "base64",
            "==",
            "image/png",
            "aGk=",
            "{}",
            "/abs",
            "a/../b"
        ])
        .prop_map(|s| json!(s)),
        ".{0,12}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_json_never_panics(v in value()) {
        match parse_request(v.to_string().as_bytes(), &RequestLimits::default()) {
            Ok(parsed) => {
                // What parsed must re-parse from its own wire form to the same request.
                let again = parse_request(serde_json::to_string(&parsed.request).unwrap().as_bytes(), &RequestLimits::default());
                prop_assert_eq!(again.map(|p| p.request), Ok(parsed.request));
            }
            Err(rejected) => prop_assert!(!rejected.errors.is_empty()),
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        match parse_request(&bytes, &RequestLimits::default()) {
            Ok(_) => {}
            Err(rejected) => prop_assert!(!rejected.errors.is_empty()),
        }
    }
}
