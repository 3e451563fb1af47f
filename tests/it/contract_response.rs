//! The exact JSON of each response kind and of a failed `InvokeResult`, pinned against
//! hand-written expected text (not produced by the same serde types).

use aptix_worker::contract::request::JsonText;
use aptix_worker::contract::response::FileRef;
use aptix_worker::contract::{
    AgentExecuteResponse, ClientToolContinuation, ErrorCode, ErrorMessage, FinalResponse,
    InvokeResult, SessionId, SessionMeta, ToolCall, ToolCallId, ToolOutcome, ToolResult, TurnId,
    Usage,
};

fn meta() -> SessionMeta {
    SessionMeta {
        session_id: SessionId::parse("s-1").unwrap(),
        turn_id: TurnId::parse("t-1").unwrap(),
        mode_display_name: "DDR Authoring".into(),
    }
}

fn call(id: &str) -> ToolCall {
    ToolCall {
        tool_call_id: ToolCallId::parse(id).unwrap(),
        name: "workspace_read_file".into(),
        arguments_json: JsonText::parse(r#"{"path":"a.md"}"#).unwrap(),
    }
}

fn minimal_final() -> FinalResponse {
    FinalResponse {
        meta: meta(),
        primary_output_text: "Done.".into(),
        files: vec![],
        tool_results: vec![],
        user_warnings: vec![],
        usage: None,
    }
}

#[test]
fn minimal_final_response_omits_every_empty_bucket() {
    let r =
        InvokeResult::success(AgentExecuteResponse::Final(minimal_final())).with_result_id("R1");
    let expected = r#"{"successful":true,"result":{"kind":"final","sessionId":"s-1","turnId":"t-1","modeDisplayName":"DDR Authoring","primaryOutputText":"Done."},"errors":[],"warnings":[],"resultId":"R1"}"#;
    assert_eq!(serde_json::to_string(&r).unwrap(), expected);
}

#[test]
fn full_final_response() {
    let mut f = minimal_final();
    f.tool_results = vec![ToolResult {
        tool_call_id: ToolCallId::parse("call_9").unwrap(),
        execution_ms: 3,
        outcome: ToolOutcome::Result(JsonText::parse(r#"{"success":true,"mode":"ddr_authoring","branch":false,"reason":"r"}"#).unwrap()),
    }, ToolResult {
        tool_call_id: ToolCallId::parse("call_10").unwrap(),
        execution_ms: 0,
        outcome: ToolOutcome::Error("ModeChangeTool requires a non-empty 'reason' string explaining why the mode change is needed.".into()),
    }];
    f.files = vec![FileRef {
        name: "out.md".into(),
        mime_type: "text/markdown".into(),
        url: "https://files.example/out.md".into(),
        size_bytes: 12,
        content_hash: "abc".into(),
        description: None,
        content_expires: Some("2026-12-01T00:00:00Z".into()),
    }];
    f.user_warnings = vec!["The answer was cut short.".into()];
    // The extension fields are left out when zero: the wire shape stays AGN-034's.
    f.usage = Some(Usage {
        prompt_tokens: 10,
        completion_tokens: 5,
        total_tokens: 15,
        cached_tokens: 0,
        reasoning_tokens: 0,
        cost_micros: 0,
    });
    let expected = concat!(
        r#"{"kind":"final","sessionId":"s-1","turnId":"t-1","modeDisplayName":"DDR Authoring","primaryOutputText":"Done.","#,
        r#""toolResults":[{"toolCallId":"call_9","executionMs":3,"resultJson":"{\"success\":true,\"mode\":\"ddr_authoring\",\"branch\":false,\"reason\":\"r\"}"},"#,
        r#"{"toolCallId":"call_10","executionMs":0,"errorMessage":"ModeChangeTool requires a non-empty 'reason' string explaining why the mode change is needed."}],"#,
        r#""files":[{"name":"out.md","mimeType":"text/markdown","url":"https://files.example/out.md","sizeBytes":12,"contentHash":"abc","contentExpires":"2026-12-01T00:00:00Z"}],"#,
        r#""userWarnings":["The answer was cut short."],"usage":{"promptTokens":10,"completionTokens":5,"totalTokens":15}}"#
    );
    let resp = AgentExecuteResponse::Final(f);
    assert_eq!(serde_json::to_string(&resp).unwrap(), expected);
    let back: AgentExecuteResponse = serde_json::from_str(expected).unwrap();
    assert_eq!(back, resp);
}

#[test]
fn client_tool_continuation_response() {
    let c = ClientToolContinuation::new(
        meta(),
        vec![call("call_1"), call("call_2")],
        Some("Reading files.".into()),
    )
    .unwrap();
    let expected = concat!(
        r#"{"kind":"client_tool_continuation","sessionId":"s-1","turnId":"t-1","modeDisplayName":"DDR Authoring","#,
        r#""toolContinuationMessage":"Reading files.","toolCalls":["#,
        r#"{"toolCallId":"call_1","name":"workspace_read_file","argumentsJson":"{\"path\":\"a.md\"}"},"#,
        r#"{"toolCallId":"call_2","name":"workspace_read_file","argumentsJson":"{\"path\":\"a.md\"}"}]}"#
    );
    let resp = AgentExecuteResponse::ClientToolContinuation(c);
    assert_eq!(serde_json::to_string(&resp).unwrap(), expected);
    let back: AgentExecuteResponse = serde_json::from_str(expected).unwrap();
    assert_eq!(back, resp);

    let bare = ClientToolContinuation::new(meta(), vec![call("c")], None).unwrap();
    let json = serde_json::to_string(&AgentExecuteResponse::ClientToolContinuation(bare)).unwrap();
    assert!(!json.contains("toolContinuationMessage"), "{json}");
}

#[test]
fn a_continuation_cannot_have_zero_tool_calls() {
    assert!(ClientToolContinuation::new(meta(), vec![], None).is_none());
    let zero = r#"{"kind":"client_tool_continuation","sessionId":"s","turnId":"t","modeDisplayName":"General","toolCalls":[]}"#;
    assert!(serde_json::from_str::<AgentExecuteResponse>(zero).is_err());
}

#[test]
fn reading_back_rejects_forbidden_buckets() {
    let bad = [
        // final with toolCalls / toolContinuationMessage / no primaryOutputText
        r#"{"kind":"final","sessionId":"s","turnId":"t","modeDisplayName":"G","primaryOutputText":"x","toolCalls":[]}"#,
        r#"{"kind":"final","sessionId":"s","turnId":"t","modeDisplayName":"G","primaryOutputText":"x","toolContinuationMessage":"m"}"#,
        r#"{"kind":"final","sessionId":"s","turnId":"t","modeDisplayName":"G"}"#,
        // continuation with any final-only bucket
        r#"{"kind":"client_tool_continuation","sessionId":"s","turnId":"t","modeDisplayName":"G","toolCalls":[{"toolCallId":"c","name":"n","argumentsJson":"{}"}],"primaryOutputText":"x"}"#,
        r#"{"kind":"client_tool_continuation","sessionId":"s","turnId":"t","modeDisplayName":"G","toolCalls":[{"toolCallId":"c","name":"n","argumentsJson":"{}"}],"toolResults":[]}"#,
        r#"{"kind":"client_tool_continuation","sessionId":"s","turnId":"t","modeDisplayName":"G","toolCalls":[{"toolCallId":"c","name":"n","argumentsJson":"{}"}],"files":[]}"#,
        r#"{"kind":"client_tool_continuation","sessionId":"s","turnId":"t","modeDisplayName":"G","toolCalls":[{"toolCallId":"c","name":"n","argumentsJson":"{}"}],"userWarnings":[]}"#,
        r#"{"kind":"client_tool_continuation","sessionId":"s","turnId":"t","modeDisplayName":"G","toolCalls":[{"toolCallId":"c","name":"n","argumentsJson":"{}"}],"usage":{"promptTokens":1,"completionTokens":1,"totalTokens":2}}"#,
        // unknown kind
        r#"{"kind":"partial","sessionId":"s","turnId":"t","modeDisplayName":"G"}"#,
    ];
    for body in bad {
        assert!(
            serde_json::from_str::<AgentExecuteResponse>(body).is_err(),
            "{body}"
        );
    }
}

#[test]
fn failed_invoke_result_never_carries_a_result() {
    let r: InvokeResult<AgentExecuteResponse> = InvokeResult::failures(vec![
        ErrorMessage::new(
            ErrorCode::ToolResultsMismatch,
            "expected 2 tool result(s), got 1",
        ),
        ErrorMessage::new(ErrorCode::Internal, "second").with_details("more"),
    ])
    .unwrap()
    .with_warnings([ErrorMessage::new(
        ErrorCode::UnknownField,
        "conversationId: is not part of the contract and was ignored",
    )])
    .with_result_id("R2");
    let expected = concat!(
        r#"{"successful":false,"errors":[{"errorCode":"TOOL_RESULTS_MISMATCH","message":"expected 2 tool result(s), got 1"},"#,
        r#"{"errorCode":"INTERNAL","message":"second","details":"more"}],"#,
        r#""warnings":[{"errorCode":"UNKNOWN_FIELD","message":"conversationId: is not part of the contract and was ignored"}],"resultId":"R2"}"#
    );
    assert_eq!(serde_json::to_string(&r).unwrap(), expected);
    let back: InvokeResult<AgentExecuteResponse> = serde_json::from_str(expected).unwrap();
    assert_eq!(back, r);
}
