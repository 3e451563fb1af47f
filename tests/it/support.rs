//! Shared test helpers: the fake model on port 0 with the official schema, and a pipeline over
//! the in-memory store pointed at it.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use aptix_worker::catalog::ModeCatalog;
use aptix_worker::contract::{AgentExecuteRequest, RequestLimits, parse_request};
use aptix_worker::fake_llm::{FakeLlm, FakeOptions, create_response_validator};
use aptix_worker::llm::LlmClient;
use aptix_worker::pipeline::{Pipeline, PipelineSettings};
use aptix_worker::store::{MemoryStore, SessionStore};
use serde_json::Value;

/// The `CreateResponse` validator, compiled once per test binary.
pub fn schema() -> Arc<jsonschema::Validator> {
    static SCHEMA: OnceLock<Arc<jsonschema::Validator>> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let path = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../shared/fixtures/openai/openapi.json"
            );
            Arc::new(
                create_response_validator(std::path::Path::new(path))
                    .expect("the official OpenAPI document loads"),
            )
        })
        .clone()
}

/// Asserts that a request body is a valid `CreateResponse`.
#[track_caller]
pub fn assert_valid_create_response(body: &Value) {
    let errors: Vec<String> = schema()
        .iter_errors(body)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "not a valid CreateResponse: {errors:?}\n{body:#}"
    );
}

pub struct Harness {
    pub fake: FakeLlm,
    pub store: Arc<MemoryStore>,
    pub pipeline: Pipeline,
}

pub struct Setup {
    pub options: FakeOptions,
    pub settings: PipelineSettings,
    pub timeout: Duration,
    pub max_retries: usize,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            options: FakeOptions::default(),
            settings: PipelineSettings::new("gpt-test"),
            timeout: Duration::from_secs(10),
            max_retries: 2,
        }
    }
}

pub async fn harness(setup: Setup) -> Harness {
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        setup.options,
        Some(schema()),
    )
    .await
    .expect("fake model starts");
    let store = Arc::new(MemoryStore::new());
    let llm = LlmClient::new(
        &fake.base_url(),
        None,
        Duration::from_secs(2),
        setup.timeout,
        setup.max_retries,
    )
    .expect("client")
    .with_min_backoff(Duration::from_millis(10));
    let dyn_store: Arc<dyn SessionStore> = store.clone();
    let pipeline = Pipeline::new(
        dyn_store,
        Arc::new(ModeCatalog::builtin()),
        llm,
        setup.settings,
    )
    .expect("pipeline");
    Harness {
        fake,
        store,
        pipeline,
    }
}

/// Parses a request literal (panics on invalid test input).
pub fn request(v: Value) -> AgentExecuteRequest {
    parse_request(v.to_string().as_bytes(), &RequestLimits::default())
        .expect("test request is valid")
        .request
}
