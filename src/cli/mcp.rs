//! `aptix tools`: the server tools in use, per mode — the built-in ones and those of the MCP
//! sources of the tools file (`APTIX_TOOLS_FILE`), each with its source, what it says of itself
//! (MCP annotations) and whether a call of it is repeated after a crash; and OpenAI's hosted
//! tools each agent context sends (tokens left out). The sources are
//! connected as a worker connects them; the command exits 1 when one does not answer.

use std::collections::BTreeSet;
use std::process::ExitCode;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use aptix_worker::catalog::ModeCatalog;
use aptix_worker::config::Config;
use aptix_worker::mcp::McpTools;
use aptix_worker::metrics::Metrics;

/// Prints the catalog in use (JSON).
pub async fn tools(config: Config) -> anyhow::Result<ExitCode> {
    let catalog = ModeCatalog::load(config.worker.modes_file.as_deref())?;
    let stop = CancellationToken::new();
    let reserved: BTreeSet<String> = catalog.tools().iter().map(|t| t.name.clone()).collect();
    let mcp = McpTools::start(
        config.tools.sources.clone(),
        config.tools.guard.clone(),
        config.tls_ca.as_ref(),
        reserved,
        std::sync::Arc::new(Metrics::new()),
        stop.clone(),
    )?;
    mcp.first_attempts().await;
    let modes: Vec<Value> = catalog
        .modes()
        .iter()
        .map(|mode| {
            let builtin = catalog.tools_for(mode).into_iter().map(|t| {
                json!({"name": t.name, "location": t.location, "strict": t.strict})
            });
            let plugged = mcp.catalog().into_iter().filter(|(_, s)| s.in_mode(&mode.key)).map(
                |(t, source)| {
                    json!({
                        "name": t.def.name,
                        "location": "server",
                        "source": source.name,
                        "remoteName": t.remote,
                        "strict": t.def.strict,
                        "annotations": t.hints,
                        "repeatedAfterACrash": t.repeat_safe,
                        "tenants": if source.tenants.is_empty() { json!("all") } else { json!(source.tenants) },
                    })
                },
            );
            json!({"mode": mode.key, "tools": builtin.chain(plugged).collect::<Vec<_>>()})
        })
        .collect();
    // OpenAI's hosted tools go with every call of their agent context, whatever the mode.
    let hosted: Vec<Value> = config
        .model
        .contexts
        .agents()
        .filter(|a| !a.calls.hosted_tools.is_empty())
        .map(|a| {
            let tools: Vec<Value> = a.calls.hosted_tools.iter().map(|t| t.describe()).collect();
            json!({"agentContext": a.id, "tools": tools})
        })
        .collect();
    let sources = mcp.status();
    let down = sources.iter().filter(|s| !s.up).count();
    let printed = json!({"sources": sources, "modes": modes, "hostedTools": hosted});
    println!("{}", serde_json::to_string_pretty(&printed)?);
    stop.cancel();
    if down > 0 {
        eprintln!("{down} MCP tool source(s) did not answer; see \"problem\" above");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
