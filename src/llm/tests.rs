//! The client's pure parts: the streamed body, responses through JSON, the endpoint.

mod serde_tests {
    use super::super::*;
    use crate::contract::Usage;

    #[test]
    fn a_streamed_body_asks_for_a_stream_and_keeps_the_rest() {
        let body = r#"{"model":"m","input":[{"role":"user","content":"{x}"}]}"#;
        let v: serde_json::Value = serde_json::from_str(&streamed(body)).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"stream": true, "model": "m", "input": [{"role": "user", "content": "{x}"}]})
        );
        let v: serde_json::Value = serde_json::from_str(&streamed("{ }")).expect("json");
        assert_eq!(v, serde_json::json!({"stream": true}));
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
