//! Behind a real gateway: LiteLLM (PyPI, installed by `.ci/run`) between the worker and the
//! fake model, in its two set-ups — passing the Responses API through to a server that speaks
//! it (`openai/…` with an `api_base`), and bridging it onto a chat-only server (`custom_openai/…`,
//! served by the fake's Chat Completions face), where LiteLLM keeps no conversation for
//! `previous_response_id` and has no `GET /responses/{id}`. Turns run on RabbitMQ and Redis.
//!
//! The gateway is found at `$APTIX_LITELLM` or where `.ci/run` installs it; a machine without
//! it fails these tests, naming what to install.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aptix_worker::fake_llm::{FakeOptions, Reply};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::app::{App, AppOptions, Backend, spawn};

/// The LiteLLM version `.ci/run` installs.
const LITELLM_VERSION: &str = "1.108.7";
/// The gateway's key (what the worker sends as `OPENAI_API_KEY`).
const MASTER_KEY: &str = "sk-aptix-gateway-test";
/// The model names the worker asks the gateway for.
const PASSTHROUGH: &str = "gw-pass";
const BRIDGE: &str = "gw-bridge";

fn litellm() -> PathBuf {
    if let Ok(path) = std::env::var("APTIX_LITELLM") {
        return PathBuf::from(path);
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    PathBuf::from(home).join(format!(
        ".cache/aptix-ci/litellm-{LITELLM_VERSION}/bin/litellm"
    ))
}

/// A LiteLLM proxy on its own port, stopped when dropped.
struct Gateway {
    child: Child,
    dir: PathBuf,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free port on 127.0.0.1 (the gateway's, known before the worker is configured).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("its address").port()
}

/// Starts LiteLLM on `port` with both set-ups in front of the fake at `upstream`
/// (`http://…/v1`), and waits until it answers.
async fn gateway(port: u16, upstream: &str) -> Gateway {
    let bin = litellm();
    assert!(
        bin.exists(),
        "LiteLLM is not installed at {} (.ci/run installs litellm[proxy]=={LITELLM_VERSION} there; or set APTIX_LITELLM)",
        bin.display()
    );
    let dir = std::env::temp_dir().join(format!("aptix-litellm-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let config = dir.join("litellm.yaml");
    std::fs::write(
        &config,
        format!(
            "model_list:\n\
             \x20 - model_name: {PASSTHROUGH}\n\
             \x20   litellm_params:\n\
             \x20     model: openai/gpt-4.1-mini\n\
             \x20     api_base: {upstream}\n\
             \x20     api_key: sk-upstream\n\
             \x20 - model_name: {BRIDGE}\n\
             \x20   litellm_params:\n\
             \x20     model: custom_openai/gpt-4.1-mini\n\
             \x20     api_base: {upstream}\n\
             \x20     api_key: sk-upstream\n\
             general_settings:\n\
             \x20 master_key: {MASTER_KEY}\n\
             litellm_settings:\n\
             \x20 telemetry: false\n"
        ),
    )
    .expect("writes the gateway's config");
    let log = std::fs::File::create(dir.join("litellm.log")).expect("a log file");
    let child = Command::new(&bin)
        .args(["--config", config.to_str().unwrap_or_default()])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("LITELLM_TELEMETRY", "False")
        .env("NO_DOCS", "True")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("the log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let gw = Gateway { child, dir };
    let health = format!("http://127.0.0.1:{port}/health/liveliness");
    let deadline = Instant::now() + Duration::from_secs(90);
    let http = reqwest::Client::new();
    loop {
        if let Ok(r) = http.get(&health).send().await
            && r.status().is_success()
        {
            return gw;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(gw.dir.join("litellm.log")).unwrap_or_default();
            panic!("LiteLLM did not answer on port {port} within 90 s:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// An app whose model server is the gateway at `port` (model `model`), with `env` on top.
async fn app_behind(
    port: u16,
    model: &str,
    env: &[(&'static str, &str)],
    fake: FakeOptions,
) -> App {
    let mut extra_env: Vec<(&'static str, String)> = vec![
        ("APTIX_LLM_BASE_URL", format!("http://127.0.0.1:{port}/v1")),
        ("OPENAI_API_KEY", MASTER_KEY.into()),
        ("APTIX_MODEL", model.into()),
    ];
    extra_env.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
    spawn(AppOptions {
        backend: Backend::Services,
        extra_env,
        fake,
        ..AppOptions::default()
    })
    .await
}

fn turn(session: &str, turn: &str, instruction: &str) -> String {
    json!({"sessionId": session, "turnId": turn, "instruction": instruction}).to_string()
}

/// Runs a turn to its end; its status view.
async fn run(app: &App, body: String) -> Value {
    let parsed: Value = serde_json::from_str(&body).expect("a turn body");
    let (status, answer) = app.post(Some("tok-a"), body).await;
    assert_eq!(status, 202, "{answer}");
    let (s, t) = (parsed["sessionId"].as_str(), parsed["turnId"].as_str());
    let (status, view) = app
        .get(
            Some("tok-a"),
            &format!(
                "/v1/sessions/{}/turns/{}?wait=60",
                s.unwrap_or_default(),
                t.unwrap_or_default()
            ),
        )
        .await;
    assert_eq!(status, 200, "{view}");
    view["result"].clone()
}

fn text(view: &Value) -> &str {
    view["result"]["result"]["primaryOutputText"]
        .as_str()
        .unwrap_or_default()
}

/// The requests the fake got in one face: Responses (`input`) or Chat Completions
/// (`messages`).
fn requests(app: &App, chat: bool) -> Vec<Value> {
    app.fake
        .requests()
        .into_iter()
        .filter(|r| r.get("messages").is_some() == chat)
        .collect()
}

/// Everything the model was shown in a request, as one string (messages or input items).
fn shown(request: &Value) -> String {
    request
        .get("messages")
        .or_else(|| request.get("input"))
        .map(Value::to_string)
        .unwrap_or_default()
}

/// The value of a counter of `/metrics` (0 when absent).
async fn counter(app: &App, series: &str) -> f64 {
    app.metrics_text()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The turns a client runs, through one set-up: a plain turn, a second turn that must carry
/// the first, a streamed turn, a server tool call, a client tool continuation and a cancel.
async fn the_turns_that_matter(model: &str, chat: bool) {
    let port = free_port();
    let app = app_behind(port, model, &[], FakeOptions::default()).await;
    let _gw = gateway(port, &app.fake.base_url()).await;

    // Plain.
    let first = run(&app, turn("s", "t1", "Summarise the design record DR-7.")).await;
    assert_eq!(first["status"], "completed", "{first}");
    assert!(
        text(&first).contains("Summarise the design record DR-7."),
        "{first}"
    );
    assert_eq!(requests(&app, chat).len(), 1);

    // A second turn: the model must see the first turn's exchange.
    let second = run(&app, turn("s", "t2", "And its consequences?")).await;
    assert_eq!(second["status"], "completed", "{second}");
    let sent = requests(&app, chat);
    let last = sent.last().expect("a request");
    let answered = text(&first);
    match chat {
        // Through the bridge the call was answered without the first turn (LiteLLM found no
        // logs for the response id), seen, and made again with the conversation replayed.
        true => {
            assert_eq!(
                sent.len(),
                3,
                "the lost answer and the replayed one: {sent:#?}"
            );
            assert!(!shown(&sent[1]).contains("DR-7"), "{}", shown(&sent[1]));
            assert!(
                shown(last).contains("DR-7") && shown(last).contains(answered),
                "the replayed call lacks the first turn: {}",
                shown(last)
            );
            assert_eq!(
                counter(&app, "aptix_model_history_lost_total{context=\"default\"}").await,
                1.0
            );
        }
        // Through the passthrough the server keeps it: one call, continuing from the first.
        false => {
            assert_eq!(sent.len(), 2, "{sent:#?}");
            assert!(last["previous_response_id"].is_string(), "{last}");
            assert_eq!(
                counter(&app, "aptix_model_history_lost_total{context=\"default\"}").await,
                0.0
            );
        }
    }
    // A third turn goes straight to replay through the bridge (the context is known now).
    let before = requests(&app, chat).len();
    let third = run(&app, turn("s", "t3", "Which one matters most?")).await;
    assert_eq!(third["status"], "completed", "{third}");
    let sent = requests(&app, chat);
    assert_eq!(sent.len(), before + 1, "one call: {sent:#?}");
    assert!(shown(&sent[before]).contains("DR-7") || !chat);

    // Streamed: the model is asked for a stream and the text arrives whole.
    let body =
        json!({"sessionId": "st", "turnId": "t", "instruction": "Stream it.", "streaming": true});
    let streamed = run(&app, body.to_string()).await;
    assert_eq!(streamed["status"], "completed", "{streamed}");
    assert!(text(&streamed).contains("Stream it."), "{streamed}");
    let last = requests(&app, chat).pop().expect("a request");
    assert_eq!(last["stream"], true, "{last}");

    // A server tool call (the mode list), then the answer from its output.
    let tool = run(&app, turn("tools", "t", "#fake:call agent_list_modes {}")).await;
    assert_eq!(tool["status"], "completed", "{tool}");
    assert_eq!(text(&tool), "Received 1 tool output(s); done.", "{tool}");

    // A client tool call: the turn waits, the client answers, the turn completes.
    let waiting = run(
        &app,
        turn(
            "client",
            "t",
            "#fake:call workspace_read_file {\"path\":\"README.md\"}",
        ),
    )
    .await;
    assert_eq!(waiting["status"], "awaiting_client_tools", "{waiting}");
    let call_id = waiting["result"]["result"]["toolCalls"][0]["toolCallId"].clone();
    let cont = json!({"sessionId": "client", "turnId": "t", "toolResults": [
        {"toolCallId": call_id, "executionMs": 3, "resultJson": "{\"contents\":\"# Aptix\"}"}]});
    let done = run(&app, cont.to_string()).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(text(&done), "Received 1 tool output(s); done.", "{done}");

    // Cancelled while the model is answering.
    app.fake.push([Reply::Delay(
        Duration::from_secs(5),
        Box::new(Reply::Text("too late".into())),
    )]);
    let before = app.fake.requests().len();
    let (status, _) = app
        .post(Some("tok-a"), turn("slow", "t", "take your time"))
        .await;
    assert_eq!(status, 202);
    app.wait_for_model_calls(before + 1).await;
    let started = Instant::now();
    let (status, body) = app
        .post_to(
            Some("tok-a"),
            "/v1/sessions/slow/turns/t/cancel",
            Vec::new(),
        )
        .await;
    // Accepted: the turn stops at its next safe point, the model call in flight abandoned.
    assert_eq!(status, 202, "{body}");
    let view = app.settled("tok-a", "slow", "t").await;
    assert_eq!(view["status"], "cancelled", "{view}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the cancel waited for the model"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_turns_that_matter_pass_through_the_gateway() {
    the_turns_that_matter(PASSTHROUGH, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_turns_that_matter_cross_the_gateways_bridge_with_their_history() {
    the_turns_that_matter(BRIDGE, true).await;
}

/// Background calls through the bridge: LiteLLM ignores `background` and answers the
/// response finished, and has no `GET /responses/{id}` — the finished answer is the answer
/// (one chat call per model call, nothing asked again), streamed or not.
#[tokio::test(flavor = "multi_thread")]
async fn background_calls_through_the_bridge_take_the_finished_answer() {
    let port = free_port();
    let app = app_behind(
        port,
        BRIDGE,
        &[("APTIX_LLM_BACKGROUND", "true")],
        FakeOptions::default(),
    )
    .await;
    let _gw = gateway(port, &app.fake.base_url()).await;
    let plain = run(&app, turn("bg", "t1", "Review DR-9 in the background.")).await;
    assert_eq!(plain["status"], "completed", "{plain}");
    assert!(text(&plain).contains("DR-9"), "{plain}");
    assert_eq!(requests(&app, true).len(), 1);
    let body = json!({"sessionId": "bg-s", "turnId": "t", "instruction": "Stream DR-9.", "streaming": true});
    let streamed = run(&app, body.to_string()).await;
    assert_eq!(streamed["status"], "completed", "{streamed}");
    assert_eq!(requests(&app, true).len(), 2);
    assert_eq!(
        counter(
            &app,
            "aptix_model_background_calls_total{event=\"foreground\"}"
        )
        .await,
        0.0
    );
}

/// A TCP relay to `upstream` that cuts its first connection once the answer passing through
/// it contains `cut_after` (and one more read); later connections pass whole.
async fn relay(upstream: u16, cut_after: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let port = listener.local_addr().expect("an address").port();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut client, _)) = listener.accept().await {
            let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
            else {
                continue;
            };
            let cut = std::mem::take(&mut first);
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.split();
                let (mut sr, mut sw) = server.split();
                let up = tokio::io::copy(&mut cr, &mut sw);
                let down = async {
                    let mut buf = vec![0u8; 4096];
                    let mut passed = String::new();
                    let mut seen = false;
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if cw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                        if cut && seen {
                            return;
                        }
                        passed.push_str(&String::from_utf8_lossy(&buf[..n]));
                        seen = passed.contains(cut_after);
                    }
                };
                tokio::select! { _ = up => {}, () = down => {} }
            });
        }
    });
    port
}

/// A background call streamed through the passthrough whose stream breaks once (a relay cuts
/// the first connection mid-answer): the worker resumes it through LiteLLM, which answers the
/// resume with the response object instead of a stream, and the turn completes with the whole
/// text from the one response the fake made — one `POST /v1/responses` upstream.
#[tokio::test(flavor = "multi_thread")]
async fn a_background_stream_cut_through_the_passthrough_completes_from_one_call() {
    let gw_port = free_port();
    let relay_port = relay(gw_port, "response.output_text.delta").await;
    let fake = FakeOptions {
        stream_pieces: 40,
        stream_delay: Duration::from_millis(40),
        ..FakeOptions::default()
    };
    let app = app_behind(
        relay_port,
        PASSTHROUGH,
        &[("APTIX_LLM_BACKGROUND", "true")],
        fake,
    )
    .await;
    let _gw = gateway(gw_port, &app.fake.base_url()).await;
    let long = "The record states its context, weighs three options against each other and \
        decides; two consequences are missing and one risk has no owner yet, which the next \
        revision should name together with a date for the review.";
    app.fake.push([Reply::Text(long.into())]);
    let body =
        json!({"sessionId": "cut", "turnId": "t", "instruction": "review", "streaming": true});
    let view = run(&app, body.to_string()).await;
    assert_eq!(view["status"], "completed", "{view}");
    assert_eq!(text(&view), long, "{view}");
    assert_eq!(requests(&app, false).len(), 1, "one POST upstream");
    assert!(
        app.fake.background_retrievals() >= 1,
        "the broken stream was never resumed"
    );
}
