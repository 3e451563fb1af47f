//! The binary's logs and spans seen from outside: JSON log lines with request ids, trace context
//! from serve through the worker to the model, a collector that refuses spans.

use super::cli::*;
use crate::support::Listening;
use std::process::Command;
use std::sync::{Arc, Mutex};

/// `APTIX_LOG_FORMAT=json`: every stderr line is a JSON object with timestamp, level, target and
/// message; each HTTP request leaves one access-log line with its method, route, status,
/// latency and request id (the client's, echoed on the answer); a turn's lines carry its
/// session and turn ids. Text logs sent to a pipe carry no colour codes.
#[tokio::test]
async fn json_logs_carry_the_request_id_and_an_access_line_per_request() {
    let mut server = Listening::start(
        aptix()
            .args(["run", "--listen", "127.0.0.1:0"])
            .env("APTIX_LOG_FORMAT", "json")
            .env("RUST_LOG", "info"),
    );
    let port = server.port;
    let client = crate::support::http_client();
    let resp = client
        .post(format!("http://127.0.0.1:{port}/api/ai/agent/execute"))
        .header("x-request-id", "req-from-client-1")
        .body(r#"{"sessionId": "log-s", "turnId": "log-t", "instruction": "hello"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["x-request-id"], "req-from-client-1");
    let resp = client
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .unwrap();
    let generated = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(
        uuid::Uuid::parse_str(&generated).map(|_| ()),
        Ok(()),
        "{generated}"
    );
    // SIGTERM: the server drains and exits, closing its stderr.
    sigterm(server.child.id());
    let _ = server.child.wait();
    let stderr = server.lines_after_exit().join("\n");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(!lines.is_empty());
    for line in &lines {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(line.get(key).is_some(), "{key} missing: {line}");
        }
    }
    let access = lines
        .iter()
        .find(|l| l["message"] == "request" && l["span"]["request_id"] == "req-from-client-1")
        .unwrap_or_else(|| panic!("no access line for the request:\n{stderr}"));
    assert_eq!(access["span"]["method"], "POST");
    assert_eq!(access["span"]["route"], "/api/ai/agent/execute");
    assert_eq!(access["status"], 200);
    assert!(access["latency_ms"].as_f64().is_some());
    assert!(
        lines.iter().any(|l| l["message"] == "request"
            && l["span"]["route"] == "/healthz"
            && l["span"]["request_id"] == generated.as_str()),
        "{stderr}"
    );
    let turn_line = lines
        .iter()
        .find(|l| l["message"] == "turn completed")
        .unwrap_or_else(|| panic!("no turn line:\n{stderr}"));
    let spans = turn_line["spans"].to_string();
    assert!(
        spans.contains("log-s") && spans.contains("log-t"),
        "{turn_line}"
    );

    // Text logs into a pipe: no ANSI escape codes.
    let out = aptix()
        .args(["run", "examples/requests/user-turn.json"])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("INFO"), "{text}");
    assert!(!text.contains('\u{1b}'), "colour codes in a pipe: {text:?}");
    // A format that does not exist is refused, naming the variable.
    let out = aptix()
        .args(["modes"])
        .env("APTIX_LOG_FORMAT", "xml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("APTIX_LOG_FORMAT"));
}

fn sigterm(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

/// One span as an OTLP collector received it.
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
#[derive(Debug, Clone)]
struct ExportedSpan {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
}

/// The part of OTLP's protobuf messages the collector below reads (field numbers from
/// `opentelemetry/proto/collector/trace/v1` and `trace/v1`); prost skips every other field.
mod otlp {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExportTraceServiceRequest {
        #[prost(message, repeated, tag = "1")]
        pub resource_spans: Vec<ResourceSpans>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceSpans {
        #[prost(message, optional, tag = "1")]
        pub resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        pub scope_spans: Vec<ScopeSpans>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Resource {
        #[prost(message, repeated, tag = "1")]
        pub attributes: Vec<KeyValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<AnyValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AnyValue {
        #[prost(string, optional, tag = "1")]
        pub string_value: Option<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ScopeSpans {
        #[prost(message, repeated, tag = "2")]
        pub spans: Vec<Span>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Span {
        #[prost(bytes = "vec", tag = "1")]
        pub trace_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub span_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "4")]
        pub parent_span_id: Vec<u8>,
        #[prost(string, tag = "5")]
        pub name: String,
    }
}

/// A minimal OpenTelemetry collector: `POST /v1/traces` with an OTLP/HTTP protobuf body.
async fn otlp_receiver() -> (String, Arc<Mutex<Vec<ExportedSpan>>>) {
    use prost::Message as _;
    let spans: Arc<Mutex<Vec<ExportedSpan>>> = Arc::default();
    let seen = spans.clone();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let seen = seen.clone();
            async move {
                let Ok(request) = otlp::ExportTraceServiceRequest::decode(body) else {
                    return axum::http::StatusCode::BAD_REQUEST;
                };
                for resource in request.resource_spans {
                    let service = resource
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|kv| kv.key == "service.name")
                        .and_then(|kv| kv.value.as_ref())
                        .and_then(|v| v.string_value.clone())
                        .unwrap_or_default();
                    for scope in resource.scope_spans {
                        for span in scope.spans {
                            seen.lock().unwrap().push(ExportedSpan {
                                service: service.clone(),
                                name: span.name,
                                trace_id: hex(&span.trace_id),
                                span_id: hex(&span.span_id),
                                parent_span_id: hex(&span.parent_span_id),
                            });
                        }
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, spans)
}

/// The spans of `trace_id` at the collector form one tree: the caller's span → `http` (serve)
/// → `job` (worker) → … → `model_call`, whose id the model got as its parent.
#[cfg(feature = "otel")]
async fn assert_one_exported_tree(
    exported: &Arc<Mutex<Vec<ExportedSpan>>>,
    trace_id: &str,
    model_parent: &str,
    logs: &dyn Fn() -> String,
) {
    let find = |name: &str| {
        exported
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.name == name && s.trace_id == trace_id)
            .cloned()
    };
    // Both processes export every 100 ms; the deadline only bounds a loaded machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ["http", "job", "model_call"]
        .iter()
        .any(|n| find(n).is_none())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "spans exported: {:#?}\nthe processes' logs (an export that failed is logged):\n{}",
            exported.lock().unwrap(),
            logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (http, job, call) = (
        find("http").unwrap(),
        find("job").unwrap(),
        find("model_call").unwrap(),
    );
    assert!(http.service.contains("aptix-serve"), "{http:?}");
    assert!(job.service.contains("aptix-worker"), "{job:?}");
    assert_eq!(http.parent_span_id, "b7ad6b7169203331", "{http:?}");
    assert_eq!(job.parent_span_id, http.span_id, "{job:?} under {http:?}");
    assert_eq!(
        model_parent, call.span_id,
        "the model's parent is the exported call span"
    );
    // model_call hangs below job, through the pipeline's spans.
    let all = exported.lock().unwrap().clone();
    let mut at = call.clone();
    while at.span_id != job.span_id {
        at = all
            .iter()
            .find(|s| s.span_id == at.parent_span_id)
            .unwrap_or_else(|| panic!("{at:?} has no exported parent in {all:#?}"))
            .clone();
    }
}

/// Trace context across the queue, between two processes: a `traceparent` sent to `aptix serve`
/// travels on the job message to `aptix worker`, whose log lines of the turn carry its trace id
/// and whose model call sends it on (same trace id, a new span id). With
/// `OTEL_EXPORTER_OTLP_ENDPOINT` set, both processes export their spans to the collector as one
/// tree: caller → `http` (serve) → `job` (worker) → … → `model_call`, whose id the model got.
#[tokio::test]
async fn trace_context_crosses_the_queue_from_serve_to_worker_to_the_model() {
    #[cfg_attr(not(feature = "otel"), allow(unused_variables))]
    let (collector, exported) = otlp_receiver().await;
    use aptix_worker::fake_llm::{FakeLlm, FakeOptions, Reply};
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        FakeOptions::default(),
        Some(crate::support::schema()),
    )
    .await
    .unwrap();
    fake.push([Reply::Text("traced".into())]);
    let guard = crate::support::rabbit().await;
    let env = |cmd: &mut Command| {
        cmd.env("APTIX_AMQP_URL", crate::support::amqp_url())
            .env("APTIX_REDIS_URL", crate::support::redis_url())
            .env("APTIX_NAMESPACE", &guard.topology.namespace)
            .env("APTIX_LLM_BASE_URL", fake.base_url())
            .env("APTIX_REPLY_QUEUE_TTL_SECS", "30")
            .env("APTIX_LOG_FORMAT", "json")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            // The turn's start and publish lines (debug) too: every line must carry the trace.
            .env(
                "RUST_LOG",
                "info,aptix_worker::pipeline=debug,aptix_worker::worker=debug",
            );
    };
    let mut serve = aptix();
    serve.args(["serve", "--listen", "127.0.0.1:0"]);
    env(&mut serve);
    let serve = Listening::start(&mut serve);
    let port = serve.port;
    let mut worker = aptix();
    worker.args(["worker", "--listen", "127.0.0.1:0"]);
    env(&mut worker);
    // Its log is read as it is written (a pipe left unread would stall the worker once full).
    let mut worker = Listening::start(&mut worker);
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let answer: serde_json::Value = crate::support::http_client()
        .post(format!("http://127.0.0.1:{port}/api/ai/agent/execute"))
        .header("traceparent", format!("00-{trace_id}-b7ad6b7169203331-01"))
        .body(r#"{"sessionId": "trace-s", "turnId": "trace-t", "instruction": "follow me"}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["result"]["primaryOutputText"], "traced", "{answer}");
    // The model got the trace: same trace id, a span id of the worker's own.
    let sent = fake.traceparents();
    assert_eq!(sent.len(), 1);
    let header = sent[0].clone().expect("the model call carries traceparent");
    let parts: Vec<&str> = header.split('-').collect();
    assert_eq!(
        (parts[0], parts[1], parts[3]),
        ("00", trace_id, "01"),
        "{header}"
    );
    assert_ne!(parts[2], "b7ad6b7169203331", "a new span id");
    // With span export built in (feature `otel`, which the README's test command turns on),
    // the collector holds one tree of that trace, across both processes.
    #[cfg(feature = "otel")]
    assert_one_exported_tree(&exported, trace_id, parts[2], &|| {
        format!(
            "serve:\n{}\nworker:\n{}",
            serve.lines().join("\n"),
            worker.lines().join("\n")
        )
    })
    .await;
    // Every log line of the turn in the worker carries the trace id.
    sigterm(worker.child.id());
    let _ = worker.child.wait();
    let lines = worker.lines_after_exit();
    let stderr = lines.join("\n");
    let turn_lines: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["spans"].to_string().contains("trace-t"))
        .collect();
    assert!(turn_lines.len() >= 2, "{stderr}");
    for line in &turn_lines {
        assert!(line["spans"].to_string().contains(trace_id), "{line}");
    }
    let keys = aptix_worker::store::RedisStore::connect(
        &crate::support::redis_url(),
        &guard.topology.namespace,
        Default::default(),
    )
    .await
    .unwrap();
    keys.delete_namespace().await.unwrap();
    // The worker's default retry queues under this namespace.
    let defaults = aptix_worker::queue::RabbitBroker::new(
        &crate::support::amqp_url(),
        aptix_worker::queue::Topology::new(&guard.topology.namespace),
        "aptix-test-cleanup",
    );
    defaults.delete_topology().await.unwrap();
}

/// A collector that refuses the spans does not fail silently: the exporting process logs the
/// failed export, at error level and with the collector's answer, and keeps serving.
#[cfg(feature = "otel")]
#[tokio::test]
async fn a_collector_that_refuses_spans_is_reported_in_the_log() {
    let refusals = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = refusals.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { axum::http::StatusCode::BAD_REQUEST }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut serve = aptix();
    serve
        .args(["serve", "--worker", "--listen", "127.0.0.1:0"])
        .env("APTIX_LOG_FORMAT", "json")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("RUST_LOG", "info");
    let serve = Listening::start(&mut serve);
    let health = crate::support::http_client()
        .get(format!("{}/healthz", serve.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let failed = loop {
        let found = serve
            .lines()
            .into_iter()
            .find(|l| l.contains("BatchSpanProcessor.ExportError"));
        if let Some(line) = found {
            break line;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no failed export logged ({} refused):\n{}",
            refusals.load(std::sync::atomic::Ordering::SeqCst),
            serve.lines().join("\n")
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let line: serde_json::Value = serde_json::from_str(&failed).expect("a JSON log line");
    assert_eq!(line["level"], "ERROR", "{line}");
    assert!(line["error"].to_string().contains("400"), "{line}");
    assert!(refusals.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    // Still serving.
    let again = crate::support::http_client()
        .get(format!("{}/healthz", serve.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
}
