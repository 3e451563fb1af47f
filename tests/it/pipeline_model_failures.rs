//! What the model's failures do to a turn: 429 with Retry-After, repeated 5xx, a terminal 400,
//! timeouts, malformed output, refusals and incomplete answers.

use super::pipeline_scenarios::*;
use crate::support::{Setup, harness, request};
use aptix_worker::contract::{AgentExecuteResponse, ErrorCode};
use aptix_worker::fake_llm::Reply;
use std::time::{Duration, Instant};

#[tokio::test]
pub(super) async fn a_429_with_retry_after_is_honoured_then_succeeds() {
    let h = harness(Setup::default()).await;
    h.fake.push([
        Reply::Error {
            status: 429,
            message: "Rate limit reached".into(),
            retry_after_ms: Some(400),
        },
        Reply::Text("ok".into()),
    ]);
    let started = Instant::now();
    let r = h.pipeline.run(&request(turn("s", "t", "x"))).await.unwrap();
    assert_eq!(final_text(&r), "ok");
    // The client's own backoff is 10 ms in tests, so only the header explains this wait.
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "retry-after-ms was not honoured"
    );
    assert_eq!(h.fake.requests().len(), 2);
}

#[tokio::test]
pub(super) async fn repeated_5xx_is_a_retryable_failure_after_the_retries() {
    let h = harness(Setup::default()).await;
    for _ in 0..3 {
        h.fake.push([Reply::Error {
            status: 503,
            message: "overloaded".into(),
            retry_after_ms: None,
        }]);
    }
    let err = h
        .pipeline
        .run(&request(turn("s", "t", "x")))
        .await
        .unwrap_err();
    assert_eq!(err.error.error_code, ErrorCode::LlmUnavailable);
    assert!(
        err.error.message.contains("after 3 attempt(s)")
            && err.error.message.contains("overloaded"),
        "{}",
        err.error.message
    );
    assert_eq!(h.fake.requests().len(), 3, "one call plus two retries");
}

#[tokio::test]
pub(super) async fn a_terminal_400_fails_the_turn_with_the_model_message() {
    let h = harness(Setup::default()).await;
    h.fake.push([Reply::Error {
        status: 400,
        message: "Invalid 'input': too long.".into(),
        retry_after_ms: None,
    }]);
    let r = h.pipeline.run(&request(turn("s", "t", "x"))).await.unwrap();
    let (code, message) = only_error(&r);
    assert_eq!(code, ErrorCode::LlmRejected);
    assert!(message.contains("Invalid 'input': too long."), "{message}");
    assert!(
        !message.contains('{'),
        "no raw vendor JSON reaches the client: {message}"
    );
    assert_eq!(h.fake.requests().len(), 1, "4xx is not retried");
}

#[tokio::test]
pub(super) async fn a_timeout_is_retryable() {
    let h = harness(Setup {
        timeout: Duration::from_millis(300),
        max_retries: 1,
        ..Setup::default()
    })
    .await;
    for _ in 0..2 {
        h.fake.push([Reply::Delay(
            Duration::from_secs(3),
            Box::new(Reply::Text("late".into())),
        )]);
    }
    let err = h
        .pipeline
        .run(&request(turn("s", "t", "x")))
        .await
        .unwrap_err();
    assert_eq!(err.error.error_code, ErrorCode::LlmUnavailable);
    assert!(
        err.error.message.contains("timed out"),
        "{}",
        err.error.message
    );
}

#[tokio::test]
pub(super) async fn malformed_and_empty_model_output_fail_the_turn() {
    for reply in [
        Reply::Malformed,
        Reply::Empty,
        Reply::Failed("invalid_prompt".into()),
    ] {
        let h = harness(Setup::default()).await;
        h.fake.push([reply.clone()]);
        let r = h.pipeline.run(&request(turn("s", "t", "x"))).await.unwrap();
        assert_eq!(only_error(&r).0, ErrorCode::LlmBadResponse, "{reply:?}");
    }
}

#[tokio::test]
pub(super) async fn refusals_incomplete_answers_and_unknown_items_are_reported() {
    let h = harness(Setup::default()).await;
    h.fake.push([
        Reply::Refusal("I can't help with that.".into()),
        Reply::Incomplete("Half an ans".into()),
        Reply::UnknownItemThenText("text".into()),
    ]);
    let r = h
        .pipeline
        .run(&request(turn("s", "t1", "x")))
        .await
        .unwrap();
    assert_eq!(final_text(&r), "I can't help with that.");
    let Some(AgentExecuteResponse::Final(f)) = r.result() else {
        unreachable!()
    };
    assert_eq!(
        f.user_warnings,
        vec!["The model declined part of this request.".to_string()]
    );
    let r = h
        .pipeline
        .run(&request(turn("s", "t2", "x")))
        .await
        .unwrap();
    let Some(AgentExecuteResponse::Final(f)) = r.result() else {
        unreachable!()
    };
    assert!(
        f.user_warnings[0].contains("max_output_tokens"),
        "{:?}",
        f.user_warnings
    );
    let r = h
        .pipeline
        .run(&request(turn("s", "t3", "x")))
        .await
        .unwrap();
    assert_eq!(final_text(&r), "text");
    assert_eq!(r.warnings()[0].error_code, ErrorCode::UnknownOutputItem);
}
