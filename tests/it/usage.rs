//! What each turn costs: every model call carries its session's `prompt_cache_key`, and a
//! turn's usage is the sum of what the model reported for its calls — cached input and
//! reasoning tokens included — in the result, the stored record and the metrics. The fake
//! model answers as the live API counts: cached tokens for a repeated prefix of 1,024+ tokens
//! under the same key, reasoning tokens for a reasoning model (`o4-mini` here).

use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, spawn};

/// The sum of `field` (a path of keys) over `usages`.
fn sum(usages: &[Value], path: &[&str]) -> u64 {
    usages
        .iter()
        .map(|u| path.iter().fold(u, |v, k| &v[*k]).as_u64().unwrap_or(0))
        .sum()
}

async fn turn(app: &App, session: &str, turn: &str, instruction: &str) -> Value {
    let body = json!({"sessionId": session, "turnId": turn, "instruction": instruction});
    let (status, accepted) = app.post(Some("tok-a"), body.to_string()).await;
    assert_eq!(status, 202, "{accepted}");
    let settled = app.settled("tok-a", session, turn).await;
    assert_eq!(settled["status"], "completed", "{settled}");
    settled
}

async fn a_turns_usage_is_the_sum_of_its_calls_cached_and_reasoning_included(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![("APTIX_MODEL", "o4-mini".into())],
        ..AppOptions::default()
    })
    .await;
    // Two model calls: a server tool, then the answer.
    let first = turn(
        &app,
        "s",
        "t1",
        "Which modes are there?\n#fake:call agent_list_modes {}",
    )
    .await;
    let usages = app.fake.usages();
    assert_eq!(usages.len(), 2, "{usages:?}");
    let usage = &first["result"]["result"]["usage"];
    assert_eq!(usage["promptTokens"], sum(&usages, &["input_tokens"]));
    assert_eq!(usage["completionTokens"], sum(&usages, &["output_tokens"]));
    assert_eq!(usage["totalTokens"], sum(&usages, &["total_tokens"]));
    assert_eq!(
        usage["reasoningTokens"],
        sum(&usages, &["output_tokens_details", "reasoning_tokens"])
    );
    assert_eq!(
        usage["reasoningTokens"], 128,
        "two calls of a reasoning model"
    );

    // Two long turns of the same session: the second finds the shared prefix cached.
    let long = "Review this design record carefully. ".repeat(150);
    turn(&app, "s", "t2", &long).await;
    let third = turn(&app, "s", "t3", &long).await;
    let usages = app.fake.usages();
    let last = usages.last().unwrap();
    let cached = last["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= 1024 && cached % 128 == 0, "{last}");
    assert_eq!(third["result"]["result"]["usage"]["cachedTokens"], cached);
    // Another session's same text has another key: nothing cached for it.
    let other = turn(&app, "s2", "t1", &long).await;
    assert!(
        other["result"]["result"]["usage"]
            .get("cachedTokens")
            .is_none(),
        "{other}"
    );
    // Every call named its session's key.
    let keys: Vec<Value> = app
        .fake
        .requests()
        .iter()
        .map(|r| r["prompt_cache_key"].clone())
        .collect();
    let s = json!(crate::support::prompt_cache_key("tenant-a/s"));
    assert_eq!(keys[..usages.len() - 1], vec![s; usages.len() - 1][..]);
    assert_eq!(
        keys.last().unwrap(),
        &json!(crate::support::prompt_cache_key("tenant-a/s2"))
    );

    // The metrics count what the model reported, by kind.
    let all = app.fake.usages();
    let metrics = app.metrics_text().await;
    for (kind, path) in [
        ("input", &["input_tokens"][..]),
        ("output", &["output_tokens"][..]),
        (
            "cached_input",
            &["input_tokens_details", "cached_tokens"][..],
        ),
        (
            "reasoning",
            &["output_tokens_details", "reasoning_tokens"][..],
        ),
    ] {
        let line = format!(
            "aptix_model_tokens_total{{kind=\"{kind}\"}} {}",
            sum(&all, path)
        );
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in\n{metrics}"
        );
    }
}

/// A context with `"promptCaching": false` sends no key.
async fn a_context_can_leave_the_cache_key_out(backend: Backend) {
    let dir = std::env::temp_dir().join(format!("aptix-ctx-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = aptix_worker::fake_llm::FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        Default::default(),
        None,
    )
    .await
    .unwrap();
    let file = dir.join("contexts.json");
    std::fs::write(
        &file,
        json!({"agentContexts": [{"id": "nocache", "baseUrl": fake.base_url(), "apiKeyEnv": "NOCACHE_KEY",
            "model": "m", "promptCaching": false}]})
        .to_string(),
    )
    .unwrap();
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![
            ("APTIX_CONTEXTS_FILE", file.display().to_string()),
            ("NOCACHE_KEY", "k".into()),
        ],
        ..AppOptions::default()
    })
    .await;
    let body =
        json!({"sessionId": "s", "turnId": "t", "instruction": "hi", "agentContextId": "nocache"});
    assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    assert_eq!(app.settled("tok-a", "s", "t").await["status"], "completed");
    let sent = fake.requests();
    assert_eq!(sent.len(), 1);
    assert!(sent[0].get("prompt_cache_key").is_none(), "{}", sent[0]);
}

/// With prices on the agent context, each turn's usage carries its estimated cost (the sum
/// over its calls at the prices), and the tenant's day adds up calls, every kind of token and
/// the cost by agent context; the metrics count the cost; a tenant over its cost quota is
/// refused.
async fn usage_and_cost_add_up_per_turn_and_per_tenant_day(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![
            ("APTIX_MODEL", "o4-mini".into()),
            // $2 per million input tokens, $0.50 cached, $8 output.
            ("APTIX_LLM_PRICES", "2,0.5,8".into()),
            crate::tenants::tenants_file(json!([{"id": "tenant-a", "costPerDay": 0.01}])),
        ],
        ..AppOptions::default()
    })
    .await;
    let done = turn(&app, "c", "t1", "Modes?\n#fake:call agent_list_modes {}").await;
    let usages = app.fake.usages();
    assert_eq!(usages.len(), 2);
    let (input, cached, output) = (
        sum(&usages, &["input_tokens"]),
        sum(&usages, &["input_tokens_details", "cached_tokens"]),
        sum(&usages, &["output_tokens"]),
    );
    // Each call priced on its own (whole micro-dollars, rounded down), then summed.
    let micros: u64 = usages
        .iter()
        .map(|u| {
            let i = u["input_tokens"].as_u64().unwrap();
            let c = u["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
            let o = u["output_tokens"].as_u64().unwrap();
            (i - c) * 2 + c / 2 + o * 8
        })
        .sum();
    let cost = done["result"]["result"]["usage"]["estimatedCostUsd"]
        .as_f64()
        .unwrap();
    assert!(
        (cost - micros as f64 / 1e6).abs() < 1e-9,
        "{cost} vs {micros}"
    );

    let (status, day) = app.get(Some("tok-a"), "/v1/tenant/usage").await;
    assert_eq!(status, 200, "{day}");
    let by = &day["result"]["byAgentContext"]["default"];
    assert_eq!(by["calls"], 2, "{day}");
    assert_eq!(by["inputTokens"], input);
    assert_eq!(by["cachedInputTokens"], cached);
    assert_eq!(by["outputTokens"], output);
    assert_eq!(by["reasoningTokens"], 128);
    assert_eq!(by["totalTokens"], input + output);
    assert_eq!(day["result"]["tokensUsed"], input + output);
    assert!((day["result"]["estimatedCostUsd"].as_f64().unwrap() - cost).abs() < 1e-9);
    assert_eq!(day["result"]["costPerDayUsd"], 0.01);
    let metrics = app.metrics_text().await;
    let counted: f64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("aptix_model_estimated_cost_dollars_total{context=\"default\"} ")
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no cost series: {metrics}"));
    assert!((counted - cost).abs() < 1e-9, "{counted} vs {cost}");

    // A day that is not a date is refused by name; a day long gone has nothing kept.
    let (status, bad) = app
        .get(Some("tok-a"), "/v1/tenant/usage?day=26.11.2026")
        .await;
    assert_eq!(status, 400, "{bad}");
    assert!(
        bad["errors"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("day:")
    );
    let (status, old) = app
        .get(Some("tok-a"), "/v1/tenant/usage?day=2020-01-01")
        .await;
    assert_eq!(status, 200, "{old}");
    assert_eq!(old["result"]["tokensUsed"], 0);
    assert_eq!(old["result"]["day"], "2020-01-01");
    assert_eq!(old["result"]["byAgentContext"], json!({}));

    // One more turn spends past $0.01; the next is refused for the day.
    let long = "Review this design record carefully. ".repeat(150);
    turn(&app, "c", "t2", &long).await;
    let body = json!({"sessionId": "c", "turnId": "t3", "instruction": "more"});
    let (status, refused) = app.post(Some("tok-a"), body.to_string()).await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["errors"][0]["errorCode"], "QUOTA_EXCEEDED");
    assert!(
        refused["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("estimated model cost"),
        "{refused}"
    );
}

/// A batch's `serviceTier` reaches every line's model calls, over the context's default.
async fn a_batch_can_ask_for_the_flex_tier(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        ..AppOptions::default()
    })
    .await;
    let lines = [
        json!({"customId": "a", "request": {"instruction": "one"}}).to_string(),
        json!({"customId": "b", "request": {"instruction": "two"}}).to_string(),
    ];
    let (status, body) = app
        .post_to(
            Some("tok-a"),
            "/v1/batches?serviceTier=flex",
            lines.join("\n"),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["result"]["batchId"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (_, progress) = app.get(Some("tok-a"), &format!("/v1/batches/{id}")).await;
        if progress["result"]["completed"] == 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{progress}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let tiers: Vec<Value> = app
        .fake
        .requests()
        .iter()
        .map(|r| r["service_tier"].clone())
        .collect();
    assert_eq!(tiers, vec![json!("flex"); 2]);
    let (status, bad) = app
        .post_to(
            Some("tok-a"),
            "/v1/batches?serviceTier=cheap",
            lines.join("\n"),
        )
        .await;
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["errors"][0]["errorCode"], "INVALID_PARAMETER");
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        a_turns_usage_is_the_sum_of_its_calls_cached_and_reasoning_included,
        a_context_can_leave_the_cache_key_out,
        usage_and_cost_add_up_per_turn_and_per_tenant_day,
        a_batch_can_ask_for_the_flex_tier,
    ],
);
