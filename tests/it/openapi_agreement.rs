//! The request schemas in `/openapi.json` say what the parser accepts: documented examples and
//! hand-picked counter-examples go through both, and both must agree. A fuzzer reading the
//! document (schemathesis in CI) then only sends requests the API really accepts as valid.

use aptix_worker::contexts::KnownContexts;
use aptix_worker::contract::{AgentExecuteRequest, RequestLimits, parse_request};
use aptix_worker::frontdoor::http::openapi;
use aptix_worker::frontdoor::routes::index::IndexRequest;
use serde_json::{Value, json};

fn validator(schema: &str) -> jsonschema::Validator {
    let doc = openapi();
    let root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": format!("#/components/schemas/{schema}"),
        "components": doc["components"],
    });
    jsonschema::validator_for(&root).expect("the document's schemas compile")
}

fn schema_errors(v: &jsonschema::Validator, body: &Value) -> Vec<String> {
    v.iter_errors(body)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect()
}

/// Request bodies both must accept, beyond the document's own examples.
fn valid_requests() -> Vec<Value> {
    vec![
        json!({"sessionId": "s", "turnId": "t", "instruction": "x"}),
        json!({"sessionId": "a.b:c-d_e", "turnId": "T".repeat(128), "instruction": " hi "}),
        json!({"sessionId": "s", "turnId": "t", "instruction": "", "inputArtifacts": [
            {"relativePath": "src/main.rs", "fileName": "main.rs", "contents": "", "origin": "user", "encoding": "base64"}
        ]}),
        json!({"sessionId": "s", "turnId": "t", "clipboardImages": [
            {"id": "img1", "mimeType": "image/svg+xml", "dataBase64": "iVBORw0KGgo="}
        ]}),
        json!({"sessionId": "s", "turnId": "t", "instruction": "x", "mode": null, "streaming": null,
            "repo": "", "agentContextId": "default", "ragScope": {"conditions": []}}),
        json!({"sessionId": "s", "turnId": "t", "instruction": "x", "unknownField": 1}),
        json!({"sessionId": "s", "turnId": "t", "instruction": "x", "ragScope": {"conditions": [
            {"key": "somethingElse", "operator": "contains", "values": ["a", "b"]}
        ]}}),
        json!({"sessionId": "s", "turnId": "t", "instruction": null, "toolResults": [
            {"toolCallId": "c", "executionMs": 12.0, "resultJson": "[]", "errorMessage": null}
        ]}),
        json!({"sessionId": "s", "turnId": "t", "toolResults": [
            {"toolCallId": "c", "executionMs": 0, "errorMessage": ""}
        ]}),
        json!({"sessionId": "s", "turnId": "t", "instruction": "x", "inputArtifacts": [
            {"relativePath": "a/..b/c..", "fileName": "f", "contents": "x", "origin": "ide"}
        ]}),
    ]
}

/// Request bodies both must refuse, with the code the parser gives.
fn invalid_requests() -> Vec<(Value, &'static str)> {
    vec![
        (json!([]), "MALFORMED_JSON"),
        (json!({"turnId": "t", "instruction": "x"}), "MISSING_FIELD"),
        (
            json!({"sessionId": "", "turnId": "t", "instruction": "x"}),
            "INVALID_ID",
        ),
        (
            json!({"sessionId": "a b", "turnId": "t", "instruction": "x"}),
            "INVALID_ID",
        ),
        (
            json!({"sessionId": "s", "turnId": "T".repeat(129), "instruction": "x"}),
            "INVALID_ID",
        ),
        (json!({"sessionId": "s", "turnId": "t"}), "EMPTY_TURN"),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "   "}),
            "EMPTY_TURN",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "inputArtifacts": []}),
            "EMPTY_TURN",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": 5}),
            "INVALID_FIELD_TYPE",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "streaming": "yes"}),
            "INVALID_FIELD_TYPE",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "agentContextId": "nope"}),
            "UNKNOWN_CONTEXT",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "conversationContextId": "x"}),
            "UNKNOWN_CONTEXT",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "mode": "general"}),
            "FORBIDDEN_FIELD",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "tools": []}),
            "FORBIDDEN_FIELD",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "agentContextId": ""}),
            "INVALID_ID",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "inputArtifacts": [
                {"relativePath": "../etc/passwd", "fileName": "p", "contents": "x", "origin": "ide"}
            ]}),
            "INVALID_PATH",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "inputArtifacts": [
                {"relativePath": "/abs", "fileName": "p", "contents": "x", "origin": "ide"}
            ]}),
            "INVALID_PATH",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "inputArtifacts": [
                {"relativePath": "C:x", "fileName": "p", "contents": "x", "origin": "ide"}
            ]}),
            "INVALID_PATH",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "inputArtifacts": [
                {"relativePath": "a\\..\\b", "fileName": "p", "contents": "x", "origin": "ide"}
            ]}),
            "INVALID_PATH",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "inputArtifacts": [
                {"relativePath": "", "fileName": "p", "contents": "x", "origin": "ide"}
            ]}),
            "INVALID_PATH",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "inputArtifacts": [
                {"relativePath": "a", "fileName": "p", "contents": "x", "origin": "disk"}
            ]}),
            "INVALID_ARTIFACT",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "inputArtifacts": [
                {"relativePath": "a", "contents": "x", "origin": "ide"}
            ]}),
            "MISSING_FIELD",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "clipboardImages": [
                {"id": " ", "mimeType": "image/png", "dataBase64": "iVBORw0KGgo="}
            ]}),
            "INVALID_IMAGE",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "clipboardImages": [
                {"id": "i", "mimeType": "text/plain", "dataBase64": "iVBORw0KGgo="}
            ]}),
            "INVALID_IMAGE",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "clipboardImages": [
                {"id": "i", "mimeType": "image/png", "dataBase64": ""}
            ]}),
            "INVALID_IMAGE",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "clipboardImages": [
                {"id": "i", "mimeType": "image/png", "dataBase64": "not base64!"}
            ]}),
            "INVALID_IMAGE",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "clipboardImages": [
                {"id": "i", "mimeType": "image/png", "dataBase64": "00=="}
            ]}),
            "INVALID_IMAGE",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "clipboardImages": [
                {"id": "i", "mimeType": "image/\u{85}png", "dataBase64": "iVBORw0KGgo="}
            ]}),
            "INVALID_IMAGE",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "clipboardImages": [
                {"id": "i", "mimeType": "image/", "dataBase64": "iVBORw0KGgo="}
            ]}),
            "INVALID_IMAGE",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "inputArtifacts": [
                {"relativePath": "a", "fileName": "a", "contents": "***", "origin": "ide", "encoding": "base64"}
            ]}),
            "INVALID_ARTIFACT",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "ragScope": {}}),
            "MISSING_FIELD",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "ragScope": {"conditions": [
                {"key": "repo", "operator": "~", "values": ["a"]}
            ]}}),
            "INVALID_RAG_CONDITION",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "ragScope": {"conditions": [
                {"key": "repo", "operator": "==", "values": []}
            ]}}),
            "INVALID_RAG_CONDITION",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "ragScope": {"conditions": [
                {"key": "", "operator": "==", "values": ["a"]}
            ]}}),
            "INVALID_RAG_CONDITION",
        ),
        // Continuations.
        (
            json!({"sessionId": "s", "turnId": "t", "toolResults": []}),
            "INVALID_TOOL_RESULT",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "instruction": "x", "toolResults": [
                {"toolCallId": "c", "executionMs": 1, "resultJson": "{}"}
            ]}),
            "FORBIDDEN_FIELD",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "streaming": false, "toolResults": [
                {"toolCallId": "c", "executionMs": 1, "resultJson": "{}"}
            ]}),
            "FORBIDDEN_FIELD",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "toolResults": [
                {"toolCallId": "c", "executionMs": -1, "resultJson": "{}"}
            ]}),
            "INVALID_TOOL_RESULT",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "toolResults": [
                {"toolCallId": "c", "executionMs": 1.5, "resultJson": "{}"}
            ]}),
            "INVALID_TOOL_RESULT",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "toolResults": [
                {"toolCallId": "c", "executionMs": "1", "resultJson": "{}"}
            ]}),
            "INVALID_FIELD_TYPE",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "toolResults": [
                {"toolCallId": "c", "resultJson": "{}"}
            ]}),
            "MISSING_FIELD",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "toolResults": [
                {"toolCallId": "c", "executionMs": 1}
            ]}),
            "INVALID_TOOL_RESULT",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "toolResults": [
                {"toolCallId": "c", "executionMs": 1, "resultJson": "{}", "errorMessage": "no"}
            ]}),
            "INVALID_TOOL_RESULT",
        ),
        (
            json!({"sessionId": "s", "turnId": "t", "toolResults": [
                {"toolCallId": "c d", "executionMs": 1, "resultJson": "{}"}
            ]}),
            "INVALID_ID",
        ),
    ]
}

/// What the schema cannot state (it says so in its description): the parser alone refuses
/// these, and a fuzzer may send them expecting success.
fn parser_only_rules() -> Vec<(Value, &'static str)> {
    vec![(
        json!({"sessionId": "s", "turnId": "t", "toolResults": [
            {"toolCallId": "c", "executionMs": 1, "resultJson": "{not json"}
        ]}),
        "INVALID_RESULT_JSON",
    )]
}

/// What the front door says: the parser, then the configured contexts (the built-in ones,
/// which is what `openapi()` documents).
fn parser_verdict(body: &Value) -> Result<(), Vec<String>> {
    let codes = |errors: &[aptix_worker::contract::ErrorMessage]| {
        errors.iter().map(|e| e.error_code.to_string()).collect()
    };
    let parsed = parse_request(body.to_string().as_bytes(), &RequestLimits::default())
        .map_err(|r| codes(&r.errors))?;
    match &parsed.request {
        AgentExecuteRequest::UserTurn(turn) => {
            KnownContexts::default().check(turn).map_err(|e| codes(&e))
        }
        AgentExecuteRequest::ToolContinuation(_) => Ok(()),
    }
}

#[test]
fn documented_examples_are_valid_for_schema_and_parser() {
    let doc = openapi();
    let examples = doc["components"]["schemas"]["AgentExecuteRequest"]["examples"]
        .as_array()
        .expect("the request schema carries examples")
        .clone();
    assert!(examples.len() >= 3);
    let v = validator("AgentExecuteRequest");
    for body in examples.iter().chain(valid_requests().iter()) {
        assert_eq!(
            schema_errors(&v, body),
            Vec::<String>::new(),
            "schema: {body}"
        );
        assert_eq!(parser_verdict(body), Ok(()), "parser: {body}");
    }
}

#[test]
fn counter_examples_are_refused_by_both() {
    let v = validator("AgentExecuteRequest");
    for (body, code) in invalid_requests() {
        assert!(
            !schema_errors(&v, &body).is_empty(),
            "the schema accepts what the parser refuses with {code}: {body}"
        );
        let codes = parser_verdict(&body).expect_err(&format!("parser accepted {body}"));
        assert!(
            codes.iter().any(|c| c == code),
            "{body}: {codes:?}, expected {code}"
        );
    }
}

#[test]
fn what_only_the_parser_checks_is_named_in_the_schema() {
    let v = validator("AgentExecuteRequest");
    let description = openapi()["components"]["schemas"]["AgentExecuteRequest"]["description"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for needle in [
        "resultJson must hold valid JSON",
        "base64 must decode",
        "APTIX_MAX_",
    ] {
        assert!(description.contains(needle), "{description}");
    }
    for (body, code) in parser_only_rules() {
        assert!(schema_errors(&v, &body).is_empty(), "{body}");
        let codes = parser_verdict(&body).expect_err("refused");
        assert!(codes.iter().any(|c| c == code), "{codes:?}");
    }
}

#[test]
fn batch_requests_may_leave_out_the_ids() {
    let v = validator("BatchRequest");
    let line = validator("BatchLine");
    let good = json!({"instruction": "x"});
    assert!(schema_errors(&v, &good).is_empty());
    assert!(schema_errors(&line, &json!({"customId": "a", "request": good})).is_empty());
    assert!(!schema_errors(&v, &json!({"instruction": "x", "sessionId": "a b"})).is_empty());
    assert!(!schema_errors(&line, &json!({"customId": "", "request": good})).is_empty());
    for (body, _) in invalid_requests()
        .into_iter()
        .filter(|(b, c)| b.get("sessionId").is_some() && *c != "MISSING_FIELD")
    {
        assert!(!schema_errors(&v, &body).is_empty(), "{body}");
    }
}

#[test]
fn index_requests_agree_with_their_schema() {
    let v = validator("IndexRequest");
    let good = [
        json!({"repo": "platform"}),
        json!({"repo": "platform", "tags": ["a"], "files": [{"path": "docs/a.md", "contents": ""}], "keep": null}),
        json!({"repo": "p", "keep": ["docs/a.md"]}),
    ];
    for body in good {
        assert!(schema_errors(&v, &body).is_empty(), "{body}");
        IndexRequest::parse(body.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{body}: {e:?}"));
    }
    let bad = [
        (json!({"repo": ""}), "INVALID_ID"),
        (json!({"repo": "a b"}), "INVALID_ID"),
        (json!({}), "MALFORMED_JSON"),
        (json!({"repo": "p", "other": 1}), "MALFORMED_JSON"),
        (json!({"repo": "p", "tags": null}), "MALFORMED_JSON"),
        (
            json!({"repo": "p", "files": [{"path": "../x", "contents": ""}]}),
            "INVALID_PATH",
        ),
        (
            json!({"repo": "p", "files": [{"path": "x"}]}),
            "MALFORMED_JSON",
        ),
        (json!({"repo": "p", "keep": ["/etc"]}), "INVALID_PATH"),
    ];
    for (body, code) in bad {
        assert!(
            !schema_errors(&v, &body).is_empty(),
            "schema accepts {body}"
        );
        let errors = IndexRequest::parse(body.to_string().as_bytes()).expect_err("refused");
        assert!(
            errors.iter().any(|e| e.error_code.to_string() == code),
            "{body}: {errors:?}"
        );
    }
}
