//! The client's pure parts: the streamed body, responses through JSON, the endpoint.

mod serde_tests {
    use super::super::*;
    use crate::contract::Usage;

    /// The body's own pieces, the first past its brace, with `"stream": true` in a piece
    /// before them.
    fn streamed(opening: &'static str, own: &'static str) -> serde_json::Value {
        let body = WireRequest::new(
            bytes::Bytes::from_static(opening.as_bytes()),
            bytes::Bytes::from_static(own.as_bytes()),
        );
        let payload = send::Payload::new(body, true);
        let [head, first, second] = payload.pieces();
        let body = [opening, own].concat();
        assert_eq!(
            [&first[..], &second[..]].concat(),
            &body.as_bytes()[1..],
            "the body past its brace"
        );
        for piece in [&first, &second] {
            let within = |whole: &str| {
                let range = whole.as_bytes().as_ptr_range();
                piece.is_empty() || range.contains(&piece.as_ptr())
            };
            assert!(within(opening) || within(own), "not copied: views");
        }
        let joined = payload.joined();
        assert_eq!(joined, [head, first, second].concat());
        serde_json::from_slice(&joined).expect("json")
    }

    #[test]
    fn a_streamed_body_asks_for_a_stream_and_keeps_the_rest() {
        let body = r#"{"model":"m","input":[{"role":"user","content":"{x}"}]}"#;
        let expected = serde_json::json!({"stream": true, "model": "m", "input": [{"role": "user", "content": "{x}"}]});
        assert_eq!(streamed(body, ""), expected);
        assert_eq!(streamed("", body), expected);
        // A prompt's opening, then the call's own piece.
        assert_eq!(
            streamed(
                r#"{"input":[{"role":"user","content":"{x}"}"#,
                r#"],"model":"m"}"#
            ),
            expected
        );
        assert_eq!(streamed("{ }", ""), serde_json::json!({"stream": true}));
        // Nothing but space between the pieces and the closing brace: no comma either.
        assert_eq!(streamed("{ ", " }"), serde_json::json!({"stream": true}));
        let plain = send::Payload::new(WireRequest::whole(&b"{}"[..]), false);
        assert_eq!(plain.joined(), &b"{}"[..]);
        let pieces = WireRequest::new(
            bytes::Bytes::from_static(b"{\"a\":"),
            bytes::Bytes::from_static(b"1}"),
        );
        assert_eq!(
            send::Payload::new(pieces, false).joined(),
            &b"{\"a\":1}"[..]
        );
    }

    #[test]
    fn model_responses_round_trip_through_json_for_checkpoints() {
        let r = ModelResponse {
            id: "resp_1".into(),
            items: vec![
                OutputItem::Text("t".into()),
                OutputItem::Refusal("r".into()),
                OutputItem::FunctionCall {
                    call_id: "c".into(),
                    name: "n".into(),
                    arguments: "{}".into(),
                },
                OutputItem::Reasoning,
                OutputItem::Unknown {
                    item_type: "x".into(),
                },
            ],
            replay_items: vec![serde_json::json!({"role": "assistant", "content": "t"})],
            incomplete_reason: Some("max_output_tokens".into()),
            usage: Usage {
                prompt_tokens: 1,
                completion_tokens: 2,
                total_tokens: 3,
                cached_tokens: 1,
                reasoning_tokens: 1,
                cost_micros: 7,
            },
            service_tier: Some("flex".into()),
            capacity_waited: Duration::ZERO,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<ModelResponse>(&text).unwrap(), r);
    }
}

mod endpoint_tests {
    use super::super::*;

    #[test]
    fn the_endpoint_is_the_base_url_and_responses_whatever_the_trailing_slash() {
        for base in ["http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1/"] {
            let endpoint = responses_endpoint(base).expect("a URL");
            assert_eq!(endpoint.as_str(), "http://127.0.0.1:9/v1/responses");
        }
        let at_root = responses_endpoint("https://models.example").expect("a URL");
        assert_eq!(at_root.as_str(), "https://models.example/responses");
    }

    #[test]
    fn a_base_url_that_is_no_http_url_is_refused_when_the_client_is_built() {
        for (base, says) in [
            ("not a url", "relative URL without a base"),
            ("ftp://example.com/v1", "its scheme is ftp:"),
            ("http://", "empty host"),
        ] {
            let e = LlmClient::new(
                base,
                None,
                Duration::from_secs(1),
                Duration::from_secs(1),
                0,
            )
            .expect_err(base);
            let text = e.to_string();
            assert!(
                text.contains(&format!("{base:?}")) && text.contains(says),
                "{base}: {text}"
            );
        }
    }
}

/// Calls over the client's own HTTP/2 connections (`h2conn`), against the fake model.
mod over_streams {
    use super::super::*;
    use crate::fake_llm::{FakeLlm, FakeOptions, Reply};

    async fn fake(options: FakeOptions) -> FakeLlm {
        let at = "127.0.0.1:0".parse().expect("an address");
        FakeLlm::start(at, options, None).await.expect("the fake")
    }

    fn client(fake: &FakeLlm, key: &str, timeout: Duration) -> LlmClient {
        let http2 = ModelHttp::parse("http2", 100).expect("a setting");
        let key = Some(Secret::new(key.to_string()));
        LlmClient::with_ca(&fake.base_url(), key, timeout, timeout, 0, None, http2)
            .expect("a client")
            .with_min_backoff(Duration::from_millis(1))
    }

    fn body() -> WireRequest {
        WireRequest::whole(&br#"{"model":"m","input":"hi"}"#[..])
    }

    /// The key goes with the call (the fake refuses calls without it, as the API does), the
    /// answer comes back whole or streamed, and a refusal keeps the model's message.
    #[tokio::test]
    async fn a_call_on_a_stream_carries_the_key_and_reads_plain_streamed_and_refused_answers() {
        let fake = fake(FakeOptions {
            api_key: Some("sk-right".into()),
            ..FakeOptions::default()
        })
        .await;
        let llm = client(&fake, "sk-right", Duration::from_secs(10));
        assert!(
            llm.http.lease().link().is_some(),
            "calls go on a stream of our own"
        );
        fake.push([Reply::Text("plain".into()), Reply::Text("streamed".into())]);
        let plain = llm.create_response("m", &body()).await.expect("an answer");
        assert!(matches!(plain.items.first(), Some(OutputItem::Text(t)) if t == "plain"));
        let deltas = std::sync::Mutex::new(String::new());
        let sink = |e: LlmEvent| {
            if let LlmEvent::TextDelta(d) = e {
                deltas.lock().expect("not poisoned").push_str(&d);
            }
        };
        let streamed = llm
            .create_response_streamed("m", &body(), Some(&sink))
            .await
            .expect("an answer");
        assert!(matches!(streamed.items.first(), Some(OutputItem::Text(t)) if t == "streamed"));
        assert_eq!(deltas.lock().expect("not poisoned").as_str(), "streamed");
        fake.push([Reply::Error {
            status: 400,
            message: "no such model".into(),
            retry_after_ms: None,
        }]);
        match llm.create_response("m", &body()).await {
            Err(LlmError::Rejected { status, message }) => {
                assert_eq!((status, message.as_str()), (400, "no such model"));
            }
            other => panic!("a rejection, not {other:?}"),
        }
        let wrong = client(&fake, "sk-wrong", Duration::from_secs(10));
        match wrong.create_response("m", &body()).await {
            Err(LlmError::Rejected { status: 401, .. }) => {}
            other => panic!("the fake refuses a wrong key, not {other:?}"),
        }
    }

    /// `model.timeout` holds a call on a stream as it holds one through reqwest.
    #[tokio::test]
    async fn a_call_on_a_stream_that_outlasts_the_timeout_fails_as_timed_out() {
        let fake = fake(FakeOptions {
            latency: Duration::from_secs(5),
            ..FakeOptions::default()
        })
        .await;
        let llm = client(&fake, "sk", Duration::from_millis(300));
        match llm.create_response("m", &body()).await {
            Err(LlmError::Unavailable { message, .. }) => {
                assert_eq!(message, "the model call timed out");
            }
            other => panic!("a timeout, not {other:?}"),
        }
    }
}
