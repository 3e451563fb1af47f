//! The `aptix` binary: parse the arguments, install telemetry, dispatch to a command of
//! [`cli`]. The work is in the library; the wiring in `aptix_worker::app`.

mod cli;

use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _};

use aptix_worker::causes::with_causes;
use aptix_worker::config::{Process, Sources};
use aptix_worker::sched::{self, CpuScheduling};
use aptix_worker::telemetry;

use cli::Cli;

/// mimalloc, not the system allocator: a turn allocates and frees many small buffers across
/// threads, and glibc's malloc spent about a third of the process's CPU on it, much of it
/// waiting on arena locks (`perf` on `aptix-bench turns --closed-loop`, docs/benchmarks.md).
/// The `system-allocator` feature keeps the system's, for heap profilers that see only
/// `malloc` (ops/bench/alloc-sites.sh).
#[cfg(not(feature = "system-allocator"))]
type Allocator = mimalloc::MiMalloc;
#[cfg(not(feature = "system-allocator"))]
const ALLOCATOR_INNER: Allocator = mimalloc::MiMalloc;
#[cfg(feature = "system-allocator")]
type Allocator = std::alloc::System;
#[cfg(feature = "system-allocator")]
const ALLOCATOR_INNER: Allocator = std::alloc::System;

#[cfg(not(feature = "count-allocations"))]
#[global_allocator]
static ALLOCATOR: Allocator = ALLOCATOR_INNER;

/// The same, counted (`cargo build --release --features count-allocations`): `/metrics` shows
/// what serve and worker allocate, and the bench reports it per turn.
#[cfg(feature = "count-allocations")]
#[global_allocator]
static ALLOCATOR: aptix_worker::allocs::Counting<Allocator> =
    aptix_worker::allocs::Counting::new(ALLOCATOR_INNER);

fn main() -> ExitCode {
    #[cfg(feature = "count-allocations")]
    aptix_worker::allocs::install(&ALLOCATOR);
    aptix_worker::tls::install_crypto_provider();
    let matches = Cli::command().get_matches();
    let service = matches.subcommand_name().unwrap_or("cli").to_string();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let default_level = cli.command.default_log_level();
    // The configuration's layers, read once: the file (APTIX_CONFIG_FILE) and the environment.
    // What is needed before the runtime starts is read from them here, the rest by the command.
    let (sources, process) = match Sources::from_env().and_then(|s| {
        let process = Process::read(&s, cli.command.long_running())?;
        Ok((s, process))
    }) {
        Ok(read) => read,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // Before the runtime starts its threads, so that they (and lapin's) inherit the class.
    let scheduling = cli.command.long_running().then(|| {
        let class = process.cpu_scheduling;
        (class, class.apply())
    });
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Span export (when asked for) sends from the runtime, so it is set up inside it.
    let telemetry = {
        let _inside = runtime.enter();
        match telemetry::init(
            process.log_format,
            default_level,
            &format!("aptix-{service}"),
            process.tls_ca.as_ref(),
        ) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {}", with_causes(&e));
                return ExitCode::from(2);
            }
        }
    };
    match scheduling {
        Some((CpuScheduling::Batch, Ok(()))) => {
            tracing::info!("CPU scheduling: SCHED_BATCH ({})", sched::VAR);
        }
        // The process works in the class it was started in; say so rather than stop.
        Some((_, Err(e))) => {
            tracing::warn!(error = %with_causes(&e), "CPU scheduling class left as it was");
        }
        _ => {}
    }
    let code = runtime.block_on(cli::run(cli, sources));
    // Flush the spans still queued while the runtime that sends them is alive.
    {
        let _inside = runtime.enter();
        telemetry.shutdown();
    }
    match code {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", with_causes(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
