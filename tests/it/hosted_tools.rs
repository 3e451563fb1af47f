//! OpenAI's hosted tools passed through from an agent context's `hostedTools`: the fake
//! answers them as the API does (each answer checked against the official `Response` schema,
//! each follow-up request against `CreateResponse`), and through the product on both backends
//! their calls are recorded on the turn and counted, and a hosted MCP call that needs approval
//! waits for a person like our own MCP tools do — answered over `previous_response_id`, and
//! over a replayed conversation.

use std::time::Duration;

use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, spawn};
use crate::contexts::fake;

const KEY: &str = "sk-hosted-0123456789";
const DOCS_TOKEN: &str = "docs-token-0123456789";

/// The hosted tools every context of these tests offers.
fn hosted_tools() -> Value {
    json!([
        {"type": "web_search", "search_context_size": "low"},
        {"type": "file_search", "vector_store_ids": ["vs_manuals"]},
        {"type": "mcp", "server_label": "docs", "server_url": "https://mcp.example.com/mcp",
         "require_approval": "never", "authorizationEnv": "DOCS_TOKEN"},
        {"type": "mcp", "server_label": "admin", "server_url": "https://admin.example.com/mcp"},
    ])
}

struct Hosted {
    app: App,
    model: aptix_worker::fake_llm::FakeLlm,
    file: std::path::PathBuf,
}

/// An app whose `default` agent context (and `replaying`, which replays the conversation
/// instead of naming the previous response) offers [`hosted_tools`] on `model`.
async fn app_with(backend: Backend) -> Hosted {
    let model = fake(KEY, Duration::ZERO).await;
    let context = |id: &str, replay: bool| {
        json!({"id": id, "baseUrl": model.base_url(), "apiKeyEnv": "HOSTED_KEY", "model": "m",
               "replay": replay, "hostedTools": hosted_tools()})
    };
    let file = std::env::temp_dir().join(format!(
        "aptix-hosted-contexts-{}.json",
        uuid::Uuid::new_v4().simple()
    ));
    let contexts =
        json!({"agentContexts": [context("default", false), context("replaying", true)]});
    std::fs::write(&file, contexts.to_string()).unwrap();
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![
            ("APTIX_CONTEXTS_FILE", file.display().to_string()),
            ("HOSTED_KEY", KEY.to_string()),
            ("DOCS_TOKEN", DOCS_TOKEN.to_string()),
        ],
        ..AppOptions::default()
    })
    .await;
    Hosted { app, model, file }
}

impl Drop for Hosted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

fn counted(text: &str, source: &str, tool: &str, outcome: &str) -> f64 {
    let series = format!(
        "aptix_tool_calls_total{{source=\"{source}\",tool=\"{tool}\",outcome=\"{outcome}\"}}"
    );
    crate::support::metric(text, &series)
}

/// The fake answers each hosted tool as the live API does, and checks an approval's answer.
#[tokio::test]
async fn the_fake_answers_hosted_tools_as_the_api_does() {
    let model = fake(KEY, Duration::ZERO).await;
    let valid = crate::support::official_answer_check("Response");
    let client = crate::support::http_client();
    let url = format!("{}/responses", model.base_url());
    let ask = |text: &str, extra: Value| {
        let mut body = json!({"model": "m", "tools": hosted_tools(),
            "input": [{"role": "user", "content": [{"type": "input_text", "text": text}]}]});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        body
    };
    let post = async |body: Value| -> (u16, Value) {
        crate::support::assert_valid_create_response(&body);
        let r = client
            .post(&url)
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    };
    let types = |answer: &Value| -> Vec<String> {
        answer["output"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["type"].as_str().unwrap().to_string())
            .collect()
    };
    for (line, expected) in [
        (
            "#fake:hosted web_search rust",
            vec!["web_search_call", "message"],
        ),
        (
            "#fake:hosted file_search torque",
            vec!["file_search_call", "message"],
        ),
        (
            "#fake:hosted mcp docs search {\"q\": 1}",
            vec!["mcp_list_tools", "mcp_call", "message"],
        ),
        (
            "#fake:hosted mcp admin drop {}",
            vec!["mcp_list_tools", "mcp_approval_request"],
        ),
    ] {
        let (status, answer) = post(ask(line, json!({}))).await;
        assert_eq!(status, 200, "{line}: {answer}");
        assert!(valid(&answer).is_ok(), "{line}: {:?}", valid(&answer));
        assert_eq!(types(&answer), expected, "{line}");
    }
    // The approval request is answered in the follow-up, over `previous_response_id`…
    let (_, waiting) = post(ask("#fake:hosted mcp admin drop {}", json!({}))).await;
    let request = waiting["output"][1].clone();
    let id = request["id"].as_str().unwrap();
    let answer = |approve: bool| json!({"type": "mcp_approval_response", "approval_request_id": id, "approve": approve});
    let follow_up = json!({"model": "m", "tools": hosted_tools(),
        "previous_response_id": waiting["id"], "input": [answer(true)]});
    let (status, done) = post(follow_up).await;
    assert_eq!(status, 200, "{done}");
    assert!(valid(&done).is_ok(), "{:?}", valid(&done));
    assert_eq!(types(&done), ["mcp_call", "message"]);
    assert_eq!(done["output"][0]["approval_request_id"], id);
    // …or with the request replayed in the input; a denial runs nothing.
    let replayed = ask("#fake:hosted mcp admin drop {}", json!({}));
    let mut input = replayed["input"].as_array().unwrap().clone();
    input.extend([request.clone(), answer(false)]);
    let (status, denied) =
        post(json!({"model": "m", "tools": hosted_tools(), "input": input})).await;
    assert_eq!(status, 200, "{denied}");
    assert_eq!(types(&denied), ["message"]);
    assert!(
        denied["output"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("denied")
    );
    // An answer to a request nobody made is refused, as the API refuses it.
    let stray = json!({"model": "m", "tools": hosted_tools(), "input": [
        {"type": "mcp_approval_response", "approval_request_id": "mcpr_nobody", "approve": true}]});
    let (status, refused) = post(stray).await;
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("mcpr_nobody")
    );
}

/// `aptix tools` lists each agent context's hosted tools, the token's variable and not the
/// token.
#[tokio::test]
async fn aptix_tools_lists_the_hosted_tools_of_each_context() {
    let file = std::env::temp_dir().join(format!(
        "aptix-hosted-tools-{}.json",
        uuid::Uuid::new_v4().simple()
    ));
    let contexts = json!({"agentContexts": [{"id": "openai", "baseUrl": "https://api.openai.com/v1",
        "apiKeyEnv": "HOSTED_KEY", "model": "m", "hostedTools": hosted_tools()}]});
    std::fs::write(&file, contexts.to_string()).unwrap();
    let out = crate::support::aptix()
        .arg("tools")
        .env("APTIX_CONTEXTS_FILE", &file)
        .env("HOSTED_KEY", KEY)
        .env("DOCS_TOKEN", DOCS_TOKEN)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !stdout.contains(DOCS_TOKEN),
        "the token is not printed: {stdout}"
    );
    let printed: Value = serde_json::from_str(&stdout).unwrap();
    let listed = &printed["hostedTools"][0];
    assert_eq!(listed["agentContext"], "openai", "{printed}");
    let tools = listed["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 4, "{printed}");
    assert_eq!(tools[2]["authorizationEnv"], "DOCS_TOKEN");
}

/// Hosted calls reach the model as tools, come back recorded on the turn and counted.
pub(super) async fn hosted_calls_are_offered_recorded_and_counted(backend: Backend) {
    let h = app_with(backend).await;
    // The second turn streams: the hosted items come as the stream's output items.
    for (turn, line, streaming) in [
        ("t1", "#fake:hosted web_search rust mcp", false),
        (
            "t2",
            "#fake:hosted mcp docs search {\"q\": \"retries\"}",
            true,
        ),
    ] {
        let body = json!({"sessionId": "s", "turnId": turn, "instruction": line,
            "streaming": streaming});
        assert_eq!(h.app.post(Some("tok-a"), body.to_string()).await.0, 202);
        let done = h.app.settled("tok-a", "s", turn).await;
        assert_eq!(done["status"], "completed", "{done}");
        // No unknown-item warning (each used to get one): these items are understood.
        assert_eq!(done["result"]["warnings"], json!([]), "{done}");
    }
    let sent = h.model.requests();
    assert_eq!(sent[1]["stream"], true, "the second turn's call streamed");
    let tools = sent[0]["tools"].as_array().unwrap();
    let kinds: Vec<&str> = tools.iter().filter_map(|t| t["type"].as_str()).collect();
    for kind in ["web_search", "file_search", "mcp"] {
        assert!(kinds.contains(&kind), "{kind} offered: {kinds:?}");
    }
    let docs = tools.iter().find(|t| t["server_label"] == "docs").unwrap();
    assert_eq!(
        docs["authorization"], DOCS_TOKEN,
        "the token named by authorizationEnv is sent"
    );
    assert!(docs.get("authorizationEnv").is_none());

    let (status, first) = h
        .app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t1/inspect")
        .await;
    assert_eq!(status, 200, "{first}");
    let notes = first["result"]["toolCalls"].as_array().unwrap();
    assert_eq!(notes.len(), 1, "{first}");
    assert_eq!(
        (
            &notes[0]["name"],
            &notes[0]["source"],
            &notes[0]["outcome"],
            &notes[0]["arguments"]
        ),
        (
            &json!("web_search"),
            &json!("openai"),
            &json!("answered"),
            &json!("rust mcp")
        ),
    );
    let (_, second) = h
        .app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t2/inspect")
        .await;
    let names: Vec<(&str, &str)> = second["result"]["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap(), n["source"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [("tools/list", "openai:docs"), ("search", "openai:docs")]
    );
    let text = h.app.metrics_text().await;
    assert_eq!(counted(&text, "openai", "web_search", "answered"), 1.0);
    assert_eq!(counted(&text, "openai:docs", "search", "answered"), 1.0);
}

/// A hosted MCP call that needs approval: the synchronous endpoint answers with the question,
/// the approval goes back as an `mcp_approval_response` over `previous_response_id`; in a
/// context that replays its conversation, a denial goes back with the request replayed.
pub(super) async fn a_hosted_mcp_call_waits_for_approval(backend: Backend) {
    let h = app_with(backend).await;
    let mut outcomes = Vec::new();
    for (session, context, verdict) in [
        ("approving", "default", json!({"approved": true})),
        (
            "denying",
            "replaying",
            json!({"approved": false, "reason": "not in prod"}),
        ),
    ] {
        let turn = json!({"sessionId": session, "turnId": "t", "agentContextId": context,
            "instruction": "#fake:hosted mcp admin drop {\"table\": \"users\"}"});
        let (status, asked) = h
            .app
            .post_to(Some("tok-a"), "/api/ai/agent/execute", turn.to_string())
            .await;
        assert_eq!(status, 200, "{asked}");
        let result = &asked["result"];
        assert_eq!(result["kind"], "client_tool_continuation", "{asked}");
        let call = &result["toolCalls"][0];
        assert_eq!(call["name"], "aptix_approve_server_tool");
        let question: Value =
            serde_json::from_str(call["argumentsJson"].as_str().unwrap()).unwrap();
        assert_eq!(
            question,
            json!({"tool": "drop", "source": "openai:admin", "arguments": {"table": "users"}, "hosted": true})
        );
        let id = call["toolCallId"].as_str().unwrap().to_string();
        assert!(id.starts_with("mcpr_"), "{id}");
        let answer = json!({"sessionId": session, "turnId": "t", "toolResults": [
            {"toolCallId": id, "executionMs": 1, "resultJson": verdict.to_string()}]});
        let (status, done) = h
            .app
            .post_to(Some("tok-a"), "/api/ai/agent/execute", answer.to_string())
            .await;
        assert_eq!(status, 200, "{done}");
        assert_eq!(done["result"]["kind"], "final", "{done}");
        let sent = h.model.requests().last().cloned().unwrap();
        let items = sent["input"].as_array().unwrap();
        let response = items
            .iter()
            .find(|i| i["type"] == "mcp_approval_response")
            .unwrap_or_else(|| panic!("no approval answer sent: {sent}"));
        assert_eq!(response["approval_request_id"], id.as_str());
        if context == "replaying" {
            assert!(sent.get("previous_response_id").is_none(), "{sent}");
            assert!(
                items
                    .iter()
                    .any(|i| i["type"] == "mcp_approval_request" && i["id"] == id.as_str())
            );
        } else {
            assert!(sent["previous_response_id"].is_string(), "{sent}");
        }
        outcomes.push((
            response["approve"].clone(),
            done["result"]["primaryOutputText"].clone(),
        ));
    }
    assert_eq!(outcomes[0].0, true);
    assert!(
        outcomes[0]
            .1
            .as_str()
            .unwrap()
            .contains("answered after approval"),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[1].0, false);
    assert!(
        outcomes[1].1.as_str().unwrap().contains("was denied"),
        "{outcomes:?}"
    );
    let text = h.app.metrics_text().await;
    assert_eq!(
        counted(&text, "openai:admin", "drop", "approval_asked"),
        2.0
    );
    assert_eq!(counted(&text, "openai:admin", "drop", "approved"), 1.0);
    assert_eq!(counted(&text, "openai:admin", "drop", "denied"), 1.0);
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        hosted_calls_are_offered_recorded_and_counted,
        a_hosted_mcp_call_waits_for_approval,
    ],
);
