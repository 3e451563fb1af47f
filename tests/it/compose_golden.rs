//! Golden tests of the composed `CreateResponse` bodies, captured from what the fake model
//! actually received, with generated ids replaced by placeholders. Every body is also checked
//! against the official OpenAPI schema.

use std::collections::HashMap;

use aptix_worker::fake_llm::Reply;
use aptix_worker::pipeline::DEFAULT_BOOT_PROMPT;
use serde_json::{Value, json};

use crate::support::{Setup, assert_valid_create_response, harness, request};

const GENERAL_BLOCK: &str = "Current Mode: general\n\nAvailable Modes:\n- general: Use this mode for everyday Q&A, explanation, and lightweight assistance.\n- ddr_authoring: Use this mode when the user wants to create, refine, or validate Aptix DDR specifications following SYS-001.\n- workflow_authoring: Use this mode when defining, editing, or validating Aptix workflows using TUL-006.\n\nMode Switching:\n- If the user’s request clearly matches another mode’s \"when to use\" description, you may recommend switching.\n- If the user expresses interest in switching, follow the instructions in the agent_change_mode tool.\n- If you need more detail about modes, call the agent_list_modes tool.";

fn block(mode: &str) -> String {
    GENERAL_BLOCK.replacen("Current Mode: general", &format!("Current Mode: {mode}"), 1)
}

fn general_tools() -> Value {
    json!([
        {"type": "function", "name": "agent_change_mode",
         "description": "Changes the mode of the current session. Call it only after the user has confirmed the switch; give a short reason, and set branch=true when the user wants the new work to start as a separate session.",
         "parameters": {"type": "object", "properties": {
             "mode": {"type": "string", "description": "Key of the target mode."},
             "branch": {"type": "boolean", "description": "true to start the new work as a separate session."},
             "reason": {"type": "string", "description": "Why the new mode fits the request."}},
           "required": ["mode", "branch", "reason"], "additionalProperties": false},
         "strict": true},
        {"type": "function", "name": "agent_list_modes",
         "description": "Lists every mode with its purpose. Call it when the user asks which modes exist or needs help choosing one, or before proposing a mode change; not on every message.",
         "parameters": {"type": "object", "properties": {
             "includeExamples": {"type": ["boolean", "null"], "description": "Include example requests for each mode."}},
           "required": ["includeExamples"], "additionalProperties": false},
         "strict": true},
        {"type": "function", "name": "workspace_read_file",
         "description": "Reads a file from the user's workspace (runs in the client).",
         "parameters": {"type": "object", "properties": {
             "path": {"type": "string", "description": "Path relative to the workspace root."}},
           "required": ["path"], "additionalProperties": false},
         "strict": true}
    ])
}

fn system() -> Value {
    json!({"role": "system", "content": [{"type": "input_text", "text": DEFAULT_BOOT_PROMPT}]})
}

/// Replaces generated `resp_…` / `call_…` ids with `<resp1>`, `<call1>`, … in order of appearance.
fn normalise(v: &Value) -> Value {
    fn walk(v: &Value, seen: &mut HashMap<String, String>) -> Value {
        match v {
            Value::String(s) => {
                for prefix in ["resp", "call"] {
                    if let Some(rest) = s.strip_prefix(&format!("{prefix}_"))
                        && !rest.is_empty()
                        && rest.chars().all(|c| c.is_ascii_hexdigit())
                    {
                        let n = seen.keys().filter(|k| k.starts_with(prefix)).count() + 1;
                        let name = seen
                            .entry(s.clone())
                            .or_insert_with(|| format!("<{prefix}{n}>"));
                        return Value::String(name.clone());
                    }
                }
                v.clone()
            }
            Value::Array(a) => Value::Array(a.iter().map(|x| walk(x, seen)).collect()),
            Value::Object(o) => {
                Value::Object(o.iter().map(|(k, x)| (k.clone(), walk(x, seen))).collect())
            }
            other => other.clone(),
        }
    }
    walk(v, &mut HashMap::new())
}

/// The fake's requests, normalised together (so ids are numbered across the conversation).
fn captured(h: &crate::support::Harness) -> Vec<Value> {
    let all = normalise(&Value::Array(h.fake.requests()));
    let bodies = all.as_array().cloned().unwrap_or_default();
    for b in &bodies {
        assert_valid_create_response(b);
    }
    bodies
}

#[track_caller]
fn assert_json_eq(actual: &Value, expected: &Value) {
    assert_eq!(
        actual, expected,
        "\nactual:   {actual:#}\nexpected: {expected:#}"
    );
}

#[tokio::test]
async fn first_turn_and_later_turn() {
    let h = harness(Setup::default()).await;
    h.fake
        .push([Reply::Text("a".into()), Reply::Text("b".into())]);
    h.pipeline
        .run(&request(
            json!({"sessionId": "s", "turnId": "t1", "instruction": "Explain AGN-033."}),
        ))
        .await
        .unwrap();
    h.pipeline
        .run(&request(
            json!({"sessionId": "s", "turnId": "t2", "instruction": "Shorter."}),
        ))
        .await
        .unwrap();
    let bodies = captured(&h);
    assert_json_eq(
        &bodies[0],
        &json!({
            "model": "gpt-test",
            "instructions": block("general"),
            "input": [system(), {"role": "user", "content": [{"type": "input_text", "text": "[MODE: general]\n\n[INSTRUCTION]\nExplain AGN-033."}]}],
            "tools": general_tools(),
            "prompt_cache_key": crate::support::prompt_cache_key("s"),
        }),
    );
    assert_json_eq(
        &bodies[1],
        &json!({
            "model": "gpt-test",
            "instructions": block("general"),
            "previous_response_id": "<resp1>",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "[MODE: general]\n\n[INSTRUCTION]\nShorter."}]}],
            "tools": general_tools(),
            "prompt_cache_key": crate::support::prompt_cache_key("s"),
        }),
    );
}

#[tokio::test]
async fn turn_with_context_chunks_solution_context_and_images() {
    let h = harness(Setup::default()).await;
    h.fake.push([Reply::Text("a".into())]);
    h.pipeline.run(&request(json!({
        "sessionId": "s", "turnId": "t1", "instruction": "Review these.",
        "inputArtifacts": [
            {"relativePath": "ddrs/AGN-900.md", "fileName": "AGN-900.md", "contents": "# AGN-900\n\nBody.\n", "origin": "user"},
            {"relativePath": "src/lib.rs", "fileName": "lib.rs", "contents": "cHViIGZuIGEoKSB7fQ==", "origin": "ide", "encoding": "base64"}
        ],
        "solutionContextText": "Repo has agent.aptix at the root.",
        "clipboardImages": [{"id": "img1", "mimeType": "image/png", "dataBase64": "iVBORw0KGgo="}]
    }))).await.unwrap();
    let bodies = captured(&h);
    let context = "[CONTEXT]\n\n=== CHUNK 1 ===\nId: artifact_1\nPath: ddrs/AGN-900.md\nLines: 1-3\nLanguage: markdown\n```markdown\n# AGN-900\n\nBody.\n```\n\n=== CHUNK 2 ===\nId: artifact_2\nPath: src/lib.rs\nLines: 1-1\nLanguage: rust\n```rust\npub fn a() {}\n```\n\n";
    assert_json_eq(
        &bodies[0]["input"][1],
        &json!({"role": "user", "content": [
            {"type": "input_text", "text": "[MODE: general]\n\n[INSTRUCTION]\nReview these."},
            {"type": "input_text", "text": context},
            {"type": "input_text", "text": "[SOLUTION CONTEXT]\nRepo has agent.aptix at the root."},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}
        ]}),
    );
    // The solution context is latched: a later turn without it still carries it.
    h.fake.push([Reply::Text("b".into())]);
    h.pipeline
        .run(&request(
            json!({"sessionId": "s", "turnId": "t2", "instruction": "More."}),
        ))
        .await
        .unwrap();
    let bodies = captured(&h);
    assert_json_eq(
        &bodies[1]["input"][0]["content"][1],
        &json!({"type": "input_text", "text": "[SOLUTION CONTEXT]\nRepo has agent.aptix at the root."}),
    );
}

#[tokio::test]
async fn calls_after_a_mode_change_and_a_tool_continuation() {
    let h = harness(Setup::default()).await;
    h.fake.push([
        Reply::Calls(vec![(
            "agent_change_mode".into(),
            json!({"mode": "ddr_authoring", "branch": false, "reason": "DDR work"}),
        )]),
        Reply::Calls(vec![(
            "workspace_read_file".into(),
            json!({"path": "a.md"}),
        )]),
        Reply::Text("done".into()),
    ]);
    let r = h
        .pipeline
        .run(&request(
            json!({"sessionId": "s", "turnId": "t1", "instruction": "Start a DDR."}),
        ))
        .await
        .unwrap();
    let Some(aptix_worker::contract::AgentExecuteResponse::ClientToolContinuation(c)) = r.result()
    else {
        panic!("{:?}", r.errors())
    };
    let call_id = c.tool_call_ids()[0].to_string();
    h.pipeline
        .run(&request(
            json!({"sessionId": "s", "turnId": "t1", "toolResults": [
                {"toolCallId": call_id, "executionMs": 3, "resultJson": "{\"text\":\"# A\"}"}
            ]}),
        ))
        .await
        .unwrap();
    let bodies = captured(&h);
    assert_eq!(bodies.len(), 3);
    // After the mode change: the new mode in instructions, the turn's tools unchanged.
    assert_json_eq(
        &bodies[1],
        &json!({
            "model": "gpt-test",
            "instructions": block("ddr_authoring"),
            "previous_response_id": "<resp1>",
            "input": [{"type": "function_call_output", "call_id": "<call1>",
                       "output": "{\"success\":true,\"mode\":\"ddr_authoring\",\"branch\":false,\"reason\":\"DDR work\"}"}],
            "tools": general_tools(),
            "prompt_cache_key": crate::support::prompt_cache_key("s"),
        }),
    );
    // The tool continuation answers the pending response with the client's result.
    assert_json_eq(
        &bodies[2],
        &json!({
            "model": "gpt-test",
            "instructions": block("ddr_authoring"),
            "previous_response_id": "<resp2>",
            "input": [{"type": "function_call_output", "call_id": "<call2>", "output": "{\"text\":\"# A\"}"}],
            "tools": general_tools(),
            "prompt_cache_key": crate::support::prompt_cache_key("s"),
        }),
    );
}

#[test]
fn the_sketches_of_agn003_are_rejected_by_the_schema() {
    // The documents' conceptual JSON is not valid for the real API; the validator must say so,
    // otherwise the golden tests above would prove nothing.
    let schema = crate::support::schema();
    for bad in [
        json!({"model": "m", "input": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}),
        json!({"model": "m", "input": "x", "tool_choice": {"type": "tool", "name": "a"}}),
        json!({"model": "m", "input": "x", "tools": [{"type": "function", "function": {"name": "a"}}]}),
        json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]}),
    ] {
        assert!(schema(&bad).is_err(), "should be invalid: {bad}");
    }
}
