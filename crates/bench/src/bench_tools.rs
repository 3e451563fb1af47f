//! `aptix-bench tool-call`: what one MCP server tool call adds to a turn, against the bare call
//! of the same tool through the same client, measured in the same run.
//!
//! A tools file names the server (any Streamable HTTP MCP server and one of its tools), as an
//! operator writes one; the product is built from it by [`aptix_worker::app::App::build`]
//! against the fake model (no latency). Three phases, one call or turn at a time so latency
//! is the path's own:
//!
//! 1. **bare**: the tool called through the product's MCP client alone (`McpTools::call`: rmcp
//!    over our HTTP client), as a turn's call reaches the server;
//! 2. **turn**: a turn without a tool call (one model call);
//! 3. **turn + tool**: a turn whose model calls the tool once (two model calls: the call, then
//!    the answer after its output — a tool call always costs the model's second look).
//!
//! Reported per call or turn: latency (p50, p95) and this process's CPU (client, worker,
//! fake model; the MCP server is another process and is not counted), and what the tool call
//! adds to a turn as a multiple of the bare call. On the embedded store unless
//! `APTIX_REDIS_URL` is set (then the sent mark is one Redis write more per call).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{Map, Value, json};

use aptix_worker::config::{Config, LOCAL_TENANT};
use aptix_worker::contract::{AgentExecuteResponse, RequestLimits, parse_request};
use aptix_worker::fake_llm::FakeOptions;
use aptix_worker::mcp::sources::ToolSources;
use aptix_worker::webhooks::guard::{Allowed, Guard};

use super::bench::{cleanup, parts_with, percentile};
use super::procfs::cpu_seconds;

/// What to measure.
#[derive(Debug, Clone)]
pub(super) struct ToolCallOptions {
    /// Calls and turns per phase.
    pub turns: usize,
    /// The server's Streamable HTTP endpoint.
    pub url: String,
    /// The tool to call.
    pub tool: String,
    /// Its arguments (a JSON object).
    pub arguments: Map<String, Value>,
}

/// One phase's figures.
struct Phase {
    p50: Duration,
    p95: Duration,
    cpu_us: f64,
}

impl Phase {
    fn line(&self, what: &str) -> String {
        format!(
            "  {what:<34} p50 {:>7.3} ms  p95 {:>7.3} ms  CPU {:>8.1} µs each (this process)",
            self.p50.as_secs_f64() * 1e3,
            self.p95.as_secs_f64() * 1e3,
            self.cpu_us
        )
    }
}

/// Runs `n` of `one` after `warm` unmeasured ones; latency and this process's CPU per run.
async fn measure<F, Fut>(n: usize, warm: usize, mut one: F) -> anyhow::Result<Phase>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    for i in 0..warm {
        one(n + i).await?;
    }
    let pid = std::process::id();
    let cpu_before = cpu_seconds(pid).unwrap_or(0.0);
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        one(i).await?;
        took.push(started.elapsed());
    }
    let cpu = cpu_seconds(pid).unwrap_or(0.0) - cpu_before;
    took.sort();
    Ok(Phase {
        p50: percentile(&took, 0.5),
        p95: percentile(&took, 0.95),
        cpu_us: cpu * 1e6 / n.max(1) as f64,
    })
}

pub(super) async fn run(config: &Config, o: ToolCallOptions) -> anyhow::Result<()> {
    let url = reqwest::Url::parse(&o.url).context("--mcp-url is not a URL")?;
    let host = url.host_str().context("--mcp-url has no host")?.to_string();
    let file = std::env::temp_dir().join(format!(
        "aptix-bench-tools-{}.json",
        uuid::Uuid::new_v4().simple()
    ));
    let sources = json!({"sources": [
        {"name": "bench", "url": o.url, "tools": [o.tool], "approval": "never"}]});
    std::fs::write(&file, sources.to_string())?;
    let loaded = ToolSources::load(&file, |_| None);
    let _ = std::fs::remove_file(&file);
    let mut config = config.clone();
    config.tools.sources = loaded?;
    let allowed: Allowed = host.parse().map_err(anyhow::Error::msg)?;
    config.tools.guard = Guard::new(url.scheme() == "http", allowed);
    let fake = FakeOptions {
        forget_requests: true,
        ..FakeOptions::default()
    };
    let p = parts_with(&config, fake).await?;
    let result = phases(&p, &o).await;
    cleanup(&p).await;
    let (bare, plain, with_tool) = result?;
    let lat_added = with_tool.p50.as_secs_f64() - plain.p50.as_secs_f64();
    let cpu_added = with_tool.cpu_us - plain.cpu_us;
    let times = |added: f64, bare: f64| added / bare.max(f64::MIN_POSITIVE);
    println!(
        "MCP tool call, {} of each, one at a time, {} at {}:",
        o.turns, o.tool, o.url
    );
    println!("{}", bare.line("baseline: bare MCP call"));
    println!("{}", plain.line("turn without a tool call"));
    println!("{}", with_tool.line("turn with one MCP tool call"));
    println!(
        "  the tool call adds to a turn: latency {:+.3} ms ({:.2}× the bare call), CPU {:+.1} µs ({:.2}× the bare call's); the model's second call is part of it",
        lat_added * 1e3,
        times(lat_added, bare.p50.as_secs_f64()),
        cpu_added,
        times(cpu_added, bare.cpu_us),
    );
    println!(
        "  beyond the bare call (the model's second call, the checkpoint, the sent mark, the ledger): latency {:+.3} ms, CPU {:+.1} µs; a turn without a tool call: {:.3} ms, {:.1} µs",
        (lat_added - bare.p50.as_secs_f64()) * 1e3,
        cpu_added - bare.cpu_us,
        plain.p50.as_secs_f64() * 1e3,
        plain.cpu_us,
    );
    Ok(())
}

/// The three phases on `p`.
async fn phases(
    p: &super::bench::Parts,
    o: &ToolCallOptions,
) -> anyhow::Result<(Phase, Phase, Phase)> {
    let mcp = p
        .app
        .mcp
        .clone()
        .context("the product started no tool sources")?;
    let mode = p.app.catalog.default_mode().key.clone();
    let tool = mcp
        .offered(&mode, LOCAL_TENANT)
        .into_iter()
        .find(|t| t.remote == o.tool)
        .with_context(|| {
            let state = mcp.status();
            format!("the server offers no tool {:?} ({state:?})", o.tool)
        })?;
    let warm = (o.turns / 10).clamp(5, 50);
    let bare = measure(o.turns, warm, |_| {
        let (mcp, tool, args) = (&mcp, &tool, o.arguments.clone());
        async move {
            mcp.call(tool, args, Map::new())
                .await
                .map_err(|e| anyhow::anyhow!("the bare call failed: {e}"))?;
            Ok(())
        }
    })
    .await?;
    let turn = |prefix: &'static str, instruction: String| {
        move |i: usize| {
            let body = json!({"sessionId": format!("{prefix}-{i}"), "turnId": "t",
                "instruction": instruction});
            async move {
                let parsed = parse_request(body.to_string().as_bytes(), &RequestLimits::default())
                    .map_err(|e| anyhow::anyhow!("the bench's request: {e:?}"))?;
                let result = p
                    .app
                    .pipeline
                    .run(&parsed.request)
                    .await
                    .map_err(|e| anyhow::anyhow!("the turn failed: {e:?}"))?;
                match result.result() {
                    Some(AgentExecuteResponse::Final(_)) => Ok(()),
                    _ => anyhow::bail!("the turn did not end in a final answer: {result:?}"),
                }
            }
        }
    };
    let plain = measure(o.turns, warm, turn("plain", "what is the weather".into())).await?;
    let call = format!(
        "#fake:call {} {}",
        tool.def.name,
        Value::Object(o.arguments.clone())
    );
    let with_tool = measure(o.turns, warm, turn("tool", call)).await?;
    Ok((bare, plain, with_tool))
}
