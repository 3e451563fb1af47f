//! Contexts across processes: two workers and a context's cap, a worker killed holding a slot,
//! `aptix contexts`, a bad contexts file.

use super::contexts::*;
use crate::app::Backend;
use crate::processes::Processes;
use aptix_worker::fake_llm::Reply;
use serde_json::Value;
use std::time::{Duration, Instant};

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        requests_reach_the_right_server_with_the_right_key_model_and_boot_prompt,
        a_session_latches_its_contexts_on_its_first_turn,
        unknown_contexts_are_refused_at_every_door,
        limits_hold_calls_of_a_context_within_one_process,
        a_turn_without_capacity_goes_back_to_the_queue_and_completes,
        a_429_holds_every_call_of_the_context_for_its_retry_after,
        an_agent_context_brings_its_own_timeout_and_replay_setting,
    ],
);

/// `aptix serve` and `aptix worker` processes with the contexts of `models`.
async fn deployment(models: &Models, workers: usize, slot_ttl_ms: u64) -> Processes {
    let mut env = models.env();
    env.push(("APTIX_CALL_SLOT_TTL_MS", slot_ttl_ms.to_string()));
    Processes::start(env, &[], workers).await
}

/// A turn `t` of `session` on agent context `agent`.
fn on(session: &str, agent: &str) -> String {
    turn(session, "t", Some(agent), None)
}

/// Live call slots of an agent context, read from Redis.
async fn slots_in_use(d: &Processes, context: &str) -> u32 {
    use aptix_worker::limiter::LimitStore as _;
    let limits = aptix_worker::limiter::RedisLimits::connect(
        &crate::support::redis_url(),
        &d.namespace,
        &aptix_worker::store::redis::RedisOptions {
            timeout: Duration::from_secs(3),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    limits.slots_in_use(context).await.unwrap()
}

#[tokio::test]
async fn two_worker_processes_never_run_more_than_the_cap_of_a_context() {
    let models = models(Duration::from_millis(400)).await;
    let d = deployment(&models, 2, 5_000).await;
    let sessions: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
    for s in &sessions {
        d.submit(on(s, "fast")).await;
    }
    for s in &sessions {
        d.wait_completed(s).await;
    }
    assert_eq!(models.fast.requests().len(), 8);
    assert_eq!(
        models.fast.peak_in_flight(),
        2,
        "two workers with eight turns each could run all eight at once; the cap is two"
    );
    assert_eq!(
        slots_in_use(&d, "fast").await,
        0,
        "every slot was given back"
    );
    // Both workers ran turns: the cap held across processes, not inside one.
    let ran = d.logged("turn started");
    assert!(ran.iter().all(|n| *n > 0), "turns per worker: {ran:?}");
}

#[tokio::test]
async fn a_worker_killed_holding_a_slot_frees_it_when_the_slot_expires() {
    const SLOT_TTL_MS: u64 = 2_000;
    let models = models(Duration::ZERO).await;
    // The first call hangs: the worker that makes it dies holding the context's only slot.
    models.fast.push([Reply::Delay(
        Duration::from_secs(30),
        Box::new(Reply::Text("too late".into())),
    )]);
    let capped_to_one = std::fs::read_to_string(&models.file)
        .unwrap()
        .replace("\"maxConcurrentCalls\":2", "\"maxConcurrentCalls\":1");
    std::fs::write(&models.file, capped_to_one).unwrap();
    let mut d = deployment(&models, 1, SLOT_TTL_MS).await;
    d.submit(on("held", "fast")).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while models.fast.requests().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the first call never reached the model"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(slots_in_use(&d, "fast").await, 1);
    let mut dead = d.workers.remove(0);
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    let killed = Instant::now();
    d.add_worker();
    d.submit(on("next", "fast")).await;
    // The dead worker's job comes back (its channel closed) and, like the new turn, needs the
    // slot the dead worker still holds until it expires.
    d.wait_completed("next").await;
    d.wait_completed("held").await;
    let freed_after = killed.elapsed();
    assert!(
        freed_after < Duration::from_millis(SLOT_TTL_MS) + Duration::from_secs(10),
        "capacity came back after {freed_after:?}"
    );
    let arrivals = models.fast.arrivals();
    assert_eq!(
        arrivals.len(),
        3,
        "the hung call, then the two turns: {arrivals:?}"
    );
    assert!(
        arrivals[1] - arrivals[0] >= Duration::from_millis(SLOT_TTL_MS - 200),
        "no call ran beside the dead worker's until its slot expired: {arrivals:?}"
    );
    assert_eq!(slots_in_use(&d, "fast").await, 0);
}

#[test]
fn aptix_contexts_prints_the_example_file_with_keys_masked() {
    let out = crate::cli::aptix()
        .args(["contexts"])
        .env("APTIX_CONTEXTS_FILE", "examples/contexts.json")
        .env("OPENAI_API_KEY", "sk-proj-0123456789abcdefWXYZ")
        .env("VLLM_API_KEY", "vllm-local-secret-key")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    let ids: Vec<&str> = listed["agentContexts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["default", "local-vllm", "openai-strong"]);
    assert_eq!(
        listed["agentContexts"][0]["model"], "gpt-4.1-mini",
        "the file's default wins"
    );
    assert_eq!(listed["agentContexts"][0]["apiKey"], "sk-…WXYZ");
    assert!(!stdout.contains("0123456789abcdef") && !stdout.contains("vllm-local-secret-key"));
    let conversations: Vec<&str> = listed["conversationContexts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(conversations, ["ddr-review", "default", "triage"]);
}

#[test]
fn a_process_with_a_bad_contexts_file_does_not_start_and_names_the_entry() {
    for command in [
        &["contexts"][..],
        &["worker", "--listen", "127.0.0.1:0"],
        &["serve", "--listen", "127.0.0.1:0"],
    ] {
        let out = crate::cli::aptix()
            .args(command)
            .env("APTIX_CONTEXTS_FILE", "examples/contexts.json")
            .env("OPENAI_API_KEY", "sk-proj-0123456789abcdefWXYZ")
            .env_remove("VLLM_API_KEY")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command:?} started: {stderr}");
        assert!(
            stderr.contains("APTIX_CONTEXTS_FILE")
                && stderr.contains("agentContexts[2] (\"local-vllm\")")
                && stderr.contains("VLLM_API_KEY"),
            "{command:?}: {stderr}"
        );
    }
}
