//! The `aptix` binary: configuration, telemetry, and the subcommands. Kept thin; the work is in
//! the library.

use std::io::Read as _;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use aptix_worker::config::Config;
use aptix_worker::contract::{self, InvokeResult};

#[derive(Parser)]
#[command(
    name = "aptix",
    version,
    about = "Queue-driven execution backend for LLM agent turns"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parse AgentExecuteRequest JSON files (or `-` for stdin) and print each InvokeResult.
    Validate {
        /// Request files to check.
        #[arg(required = true)]
        files: Vec<String>,
    },
    /// Print the table of error codes as Markdown.
    ErrorCodes,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Validate { files } => {
            let config = Config::from_env()?;
            let mut all_valid = true;
            for file in files {
                let body = if file == "-" {
                    let mut buf = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut buf)
                        .context("reading stdin")?;
                    buf
                } else {
                    std::fs::read(&file).with_context(|| format!("reading {file}"))?
                };
                let result = match contract::parse_request(&body, &config.limits) {
                    Ok(parsed) => {
                        InvokeResult::success(parsed.request).with_warnings(parsed.warnings)
                    }
                    Err(rejected) => rejected.into_invoke_result(),
                };
                all_valid &= result.is_successful();
                println!("{file}: {}", serde_json::to_string_pretty(&result)?);
            }
            Ok(if all_valid {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::ErrorCodes => {
            print!("{}", contract::codes::markdown_table());
            Ok(ExitCode::SUCCESS)
        }
    }
}
