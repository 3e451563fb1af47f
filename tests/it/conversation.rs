//! A session's conversation through the whole product, on both backends: a model server that
//! keeps no responses (`APTIX_LLM_REPLAY`) is sent every earlier item of the session once and
//! in order, turn after turn — across the first turn, whose items a Redis store keeps with the
//! session (it has no list yet), and the second, whose save lists them ahead of its own.

use aptix_worker::fake_llm::{FakeOptions, Reply};
use serde_json::{Value, json};

use crate::app::{AppOptions, Backend, spawn};

/// What a request's input says, by role, the system message left out: a user message is the
/// instruction under the mode's header (its last line), an assistant's its text.
pub(crate) fn said(request: &Value) -> Vec<(String, String)> {
    request["input"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|item| item["role"] != "system")
        .map(|item| {
            let content = match &item["content"] {
                Value::String(text) => text.clone(),
                other => other[0]["text"].as_str().unwrap_or_default().to_string(),
            };
            let last = content.rsplit('\n').next().unwrap_or_default();
            (
                item["role"].as_str().unwrap_or_default().to_string(),
                last.to_string(),
            )
        })
        .collect()
}

/// `(role, text)` pairs as [`said`] gives them.
pub(crate) fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(role, text)| (role.to_string(), text.to_string()))
        .collect()
}

async fn a_replaying_model_gets_the_whole_conversation_once_in_order(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![("APTIX_LLM_REPLAY", "true".into())],
        fake: FakeOptions {
            stateless: true,
            ..FakeOptions::default()
        },
        ..AppOptions::default()
    })
    .await;
    app.fake.push([
        Reply::Text("one".into()),
        Reply::Text("two".into()),
        Reply::Text("three".into()),
    ]);
    for (turn, asked) in [("t1", "first"), ("t2", "second"), ("t3", "third")] {
        let body = json!({"sessionId": "s", "turnId": turn, "instruction": asked});
        let (status, body) = app
            .post_to(Some("tok-a"), "/api/ai/agent/execute", body.to_string())
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["kind"], "final", "{body}");
    }
    let requests = app.fake.requests();
    assert_eq!(requests.len(), 3);
    assert!(
        requests
            .iter()
            .all(|r| r.get("previous_response_id").is_none()),
        "every call replays"
    );
    // The session's system message opens every call once: the first carries it as the
    // turn's boot prompt, the later ones replay it from the stored conversation.
    for request in &requests {
        let input = request["input"].as_array().expect("input items");
        let systems = input.iter().filter(|item| item["role"] == "system").count();
        assert_eq!(input[0]["role"], "system", "{request}");
        assert_eq!(systems, 1, "{request}");
    }
    assert_eq!(said(&requests[0]), pairs(&[("user", "first")]));
    assert_eq!(
        said(&requests[1]),
        pairs(&[("user", "first"), ("assistant", "one"), ("user", "second")])
    );
    assert_eq!(
        said(&requests[2]),
        pairs(&[
            ("user", "first"),
            ("assistant", "one"),
            ("user", "second"),
            ("assistant", "two"),
            ("user", "third"),
        ])
    );
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [a_replaying_model_gets_the_whole_conversation_once_in_order],
);
