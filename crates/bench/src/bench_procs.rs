//! `aptix-bench turns --closed-loop --processes`: the closed loop against the product as an operator
//! runs it — `aptix fake-llm`, `aptix serve` and `aptix worker` as separate processes of this
//! binary on RabbitMQ and Redis, under a namespace of the run's own — so each process gets
//! its own CPU per turn and its own memory per turn in flight. The clients run in this
//! process, which is measured too (it is load, not product).

use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;

use aptix_worker::config::Config;
use aptix_worker::queue::RabbitBroker;
use aptix_worker::store::RedisStore;
use tokio_util::sync::CancellationToken;

use super::bench_allocs::{InFlight, held_report, report as allocs_report, scrape};
use super::bench_callgrind::{Callgrind, Counted};
use super::bench_in_flight as in_flight;
use super::bench_loop::{LoopOptions, baseline, drive};
use super::bench_verdict::Part;
use super::procfs::{cpu_snapshot, status_kib};

/// How long a process has to report that it is ready.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// A child process of the run, killed when dropped.
struct Proc {
    label: &'static str,
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How many of a process's last log lines are shown when it ends before it is ready.
const LAST_LINES: usize = 20;

impl Proc {
    /// Starts `cmd` with its log on a pipe and waits (up to `within`) for a log line containing
    /// `ready`; returns the process and that line. The rest of its log is read and dropped in
    /// the background (a full pipe would stall it).
    fn start(
        label: &'static str,
        cmd: &mut Command,
        ready: &str,
        within: Duration,
    ) -> anyhow::Result<(Self, String)> {
        // The processes log as deployed by default (`info`): their log is part of what a turn
        // costs, and the lines that say they are ready are `info` lines.
        let mut child = cmd
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {label}"))?;
        let stderr = child.stderr.take().context("stderr is piped")?;
        let mut proc = Self { label, child };
        let (tx, rx) = std::sync::mpsc::channel();
        let ready = ready.to_string();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            // Until it is ready, its last lines are kept to say why, should it not get there.
            let mut last = std::collections::VecDeque::with_capacity(LAST_LINES);
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let Some(sender) = tx.take() else { continue };
                if line.contains(&ready) {
                    let _ = sender.send(Ok(line));
                    continue;
                }
                if last.len() == LAST_LINES {
                    last.pop_front();
                }
                last.push_back(line);
                tx = Some(sender);
            }
            if let Some(sender) = tx {
                let _ = sender.send(Err(Vec::from(last)));
            }
        });
        match rx.recv_timeout(within) {
            Ok(Ok(line)) => Ok((proc, line)),
            Ok(Err(last)) => {
                let status = proc
                    .child
                    .wait()
                    .map_or_else(|e| format!("cannot be waited for: {e}"), |s| s.to_string());
                anyhow::bail!(
                    "{label} ended before it was ready ({status}); its last lines:\n{}",
                    last.join("\n")
                )
            }
            Err(_) => anyhow::bail!(
                "{label} did not report that it was ready within {} s",
                within.as_secs()
            ),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory now, in KiB.
    fn resident(&self) -> u64 {
        status_kib(self.pid(), "VmRSS:").unwrap_or(0)
    }

    /// Peak resident memory, in KiB.
    fn peak(&self) -> u64 {
        status_kib(self.pid(), "VmHWM:").unwrap_or(0)
    }
}

/// The `host:port` after `key` in a log line (`address=127.0.0.1:P`, `base_url=http://…`).
fn address_after(line: &str, key: &str) -> Option<String> {
    let rest = &line[line.find(key)? + key.len()..];
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '"' || c == '/')
        .unwrap_or(rest.len());
    Some(rest[..end].to_string()).filter(|a| a.contains(':'))
}

/// Runs the closed loop against separate processes, then the baseline.
pub async fn run(config: &Config, opts: &LoopOptions) -> anyhow::Result<()> {
    let (Some(amqp), Some(redis)) = (&config.broker.url, &config.store.url) else {
        anyhow::bail!(
            "the closed loop measures the services path: set APTIX_AMQP_URL and APTIX_REDIS_URL"
        );
    };
    let exe = aptix_binary()?;
    let namespace = format!(
        "{}-bench-{}",
        config.namespace,
        uuid::Uuid::new_v4().simple()
    );
    // Whatever happens (a process that does not start, a failed run), the run's queues and
    // keys go afterwards.
    let result = start_and_measure(&exe, &namespace, opts, config).await;
    let mut topology = config.topology();
    topology.namespace = namespace.clone();
    let _ = RabbitBroker::new(amqp.expose(), topology, "aptix-bench-cleanup")
        .delete_topology()
        .await;
    if let Ok(r) = RedisStore::connect(redis.expose(), &namespace, config.store.retention).await {
        let _ = r.delete_namespace().await;
    }
    result?;
    let this = [(
        "the baseline's client",
        Part::Harness,
        vec![std::process::id()],
    )];
    baseline(config, opts.baseline_messages.max(1), &this).await
}

/// Starts the fake model, `serve` and `worker` under `namespace`, runs the loop against them
/// and stops them (dropping a [`Proc`] kills it).
async fn start_and_measure(
    exe: &std::path::Path,
    namespace: &str,
    opts: &LoopOptions,
    config: &Config,
) -> anyhow::Result<()> {
    let callgrind = opts
        .callgrind
        .map(|counted| Callgrind::new(counted, opts.callgrind_out.as_deref()))
        .transpose()?;
    // Under valgrind a process starts many times slower.
    let within = |which| match &callgrind {
        Some(cg) if cg.counted == which => 6 * READY_WITHIN,
        _ => READY_WITHIN,
    };
    // With Redis counted, the product's store is a private server under callgrind.
    let private_redis = match &callgrind {
        Some(cg) if cg.counted == Counted::Redis => Some(PrivateRedis::start(cg)?),
        _ => None,
    };
    let latency = opts.latency.as_millis().to_string();
    let (fake, line) = Proc::start(
        "the fake model",
        &mut Callgrind::command(
            callgrind.as_ref(),
            Counted::FakeLlm,
            exe,
            &[
                "fake-llm",
                "--listen",
                "127.0.0.1:0",
                "--latency-ms",
                &latency,
            ],
        ),
        "fake Responses API listening",
        within(Counted::FakeLlm),
    )?;
    let model = address_after(&line, "base_url=http://")
        .context("the fake model's log does not name its address")?;
    let product = |cmd: &mut Command| {
        cmd.env("APTIX_NAMESPACE", namespace)
            .env("APTIX_LLM_BASE_URL", format!("http://{model}/v1"))
            .env("APTIX_MODEL", "bench-model")
            .env("APTIX_CONCURRENCY", opts.concurrency.to_string())
            // Left-over reply queues (if the run is interrupted) vanish soon.
            .env("APTIX_REPLY_QUEUE_TTL_SECS", "60")
            .env_remove("OPENAI_API_KEY");
        if let Some(redis) = &private_redis {
            cmd.env("APTIX_REDIS_URL", &redis.url);
        }
    };
    let mut serve_cmd = Callgrind::command(
        callgrind.as_ref(),
        Counted::Serve,
        exe,
        &["serve", "--listen", "127.0.0.1:0"],
    );
    product(&mut serve_cmd);
    let (serve, line) = Proc::start(
        "aptix serve",
        &mut serve_cmd,
        "HTTP API listening",
        within(Counted::Serve),
    )?;
    let front_door =
        address_after(&line, "address=").context("aptix serve's log does not name its address")?;
    // The worker's /metrics (its allocations, in a build that counts them) on a port of the
    // run's own.
    let worker_ops = format!("127.0.0.1:{}", free_port()?);
    let mut worker_cmd = Callgrind::command(
        callgrind.as_ref(),
        Counted::Worker,
        exe,
        &["worker", "--listen", &worker_ops],
    );
    product(&mut worker_cmd);
    let (worker, _) = Proc::start(
        "aptix worker",
        &mut worker_cmd,
        "consuming turn jobs",
        within(Counted::Worker),
    )?;
    // Ctrl-C ends the run here, so the processes are stopped and the run's queues and keys
    // removed rather than left behind.
    let procs = [&serve, &worker, &fake];
    let counted = callgrind.as_ref().and_then(|cg| {
        let p = match cg.counted {
            Counted::Worker => &worker,
            Counted::Serve => &serve,
            Counted::FakeLlm => &fake,
            Counted::Redis => &private_redis.as_ref()?.proc,
        };
        Some((cg, p))
    });
    let store = private_redis.as_ref().map(|r| r.url.as_str());
    tokio::select! {
        measured = measure([&front_door, &worker_ops], opts, config, procs, counted, store) => measured,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted"),
    }
}

/// A `redis-server` of the run's own under callgrind ([`Counted::Redis`]): a free port,
/// nothing kept on disk, its log on stderr (where [`Proc::start`] looks for its ready line).
/// Stopped (and its directory removed) when dropped.
struct PrivateRedis {
    proc: Proc,
    url: String,
    dir: std::path::PathBuf,
}

impl PrivateRedis {
    fn start(cg: &Callgrind) -> anyhow::Result<Self> {
        let port = free_port()?.to_string();
        let dir = std::env::temp_dir().join(format!(
            "aptix-bench-redis-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir_arg = dir.to_string_lossy().into_owned();
        let args = [
            "--port",
            port.as_str(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            dir_arg.as_str(),
            "--logfile",
            "/dev/stderr",
        ];
        let exe = std::path::Path::new("redis-server");
        let mut cmd = Callgrind::command(Some(cg), Counted::Redis, exe, &args);
        let started = Proc::start(
            "Redis (a private redis-server)",
            &mut cmd,
            "Ready to accept connections",
            6 * READY_WITHIN,
        );
        let proc = match started {
            Ok((proc, _)) => proc,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        Ok(Self {
            proc,
            url: format!("redis://127.0.0.1:{port}/"),
            dir,
        })
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The commands the Redis server behind `conn` has processed since it started (`INFO stats`).
async fn commands_processed(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .context("reading the private Redis's statistics")?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .context("the private Redis's INFO has no total_commands_processed")
}

/// A port free on the loopback now (the system picks it; the worker binds it moments later).
fn free_port() -> anyhow::Result<u16> {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(probe.local_addr()?.port())
}

/// Drives the clients against the front door at `address` and prints the figures (the
/// worker's allocations read from `worker_ops`).
async fn measure(
    [address, worker_ops]: [&str; 2],
    opts: &LoopOptions,
    config: &Config,
    [serve, worker, fake]: [&Proc; 3],
    counted: Option<(&Callgrind, &Proc)>,
    private_store: Option<&str>,
) -> anyhow::Result<()> {
    let watched = vec![
        (serve.label, Part::Product, vec![serve.pid()]),
        (worker.label, Part::Product, vec![worker.pid()]),
        (fake.label, Part::Harness, vec![fake.pid()]),
        (
            "the bench's clients",
            Part::Harness,
            vec![std::process::id()],
        ),
    ];
    let resident = (serve.resident(), worker.resident());
    // Allocations are read outside the instructions' and the CPU's window: the scrapes are
    // the bench's, not a turn's.
    let scraper = reqwest::Client::new();
    let allocated = || async {
        (
            scrape(&scraper, address).await,
            scrape(&scraper, worker_ops).await,
        )
    };
    let allocated_before = allocated().await;
    // One connection for both reads, so that only the first read falls between them.
    let mut store = match private_store {
        Some(url) => Some(
            redis::Client::open(url)
                .context("the private Redis's URL")?
                .get_multiplexed_async_connection()
                .await
                .context("connecting to the private Redis")?,
        ),
        None => None,
    };
    let commands_before = match store.as_mut() {
        Some(conn) => Some(commands_processed(conn).await?),
        None => None,
    };
    if let Some((cg, p)) = counted {
        cg.zero(p.pid())?;
    }
    // How many turns each process holds at once is read while they run, in a run for memory:
    // the heap counted, no process under callgrind, and turns that wait on the model (a
    // second or more). The reads are the processes' own work, in the CPU and allocation
    // windows, so a run for those (a fast model) makes none.
    let for_memory = opts.latency >= Duration::from_secs(1);
    let sampled = (allocated_before.1.is_some() && counted.is_none() && for_memory).then(|| {
        let stop = CancellationToken::new();
        let watch = tokio::spawn(in_flight::watch(
            scraper.clone(),
            address.to_string(),
            worker_ops.to_string(),
            Duration::from_millis(100),
            stop.clone(),
        ));
        // A run that ends early (its `?` below) stops the reads too.
        (stop.drop_guard(), watch)
    });
    let before = cpu_snapshot(&watched);
    let driven = drive(&format!("http://{address}"), opts).await?;
    let after = cpu_snapshot(&watched);
    let peaks = match sampled {
        Some((stop, watch)) => {
            drop(stop);
            watch.await.ok()
        }
        None => None,
    };
    let instructions = counted
        .map(|(cg, p)| {
            cg.instructions(p.pid())
                .map(|(n, dump)| (p.label, n, cg.kept().then_some(dump)))
        })
        .transpose()?;
    let commands_after = match store.as_mut() {
        Some(conn) => Some(commands_processed(conn).await?),
        None => None,
    };
    let allocated_after = allocated().await;
    // The processes inherit the runtime's thread count (tokio's `TOKIO_WORKER_THREADS`).
    let mut threads = match std::env::var("TOKIO_WORKER_THREADS") {
        Ok(n) => format!("serve, worker and fake model as processes of {n} runtime thread(s)"),
        Err(_) => "serve, worker and fake model as processes, one runtime thread per core".into(),
    };
    // Serve and worker read APTIX_CPU_SCHEDULING (an unknown class would have stopped them at
    // start); the fake model and the clients keep the normal class.
    if config.worker.cpu_scheduling == aptix_worker::sched::CpuScheduling::Batch {
        threads.push_str(", serve and worker in SCHED_BATCH (APTIX_CPU_SCHEDULING=batch)");
    }
    driven.report(
        opts,
        config.broker.reply_queues.as_str(),
        &threads,
        &before,
        &after,
    );
    let grown = |before: u64, p: &Proc| p.peak().saturating_sub(before);
    let (serve_grew, worker_grew) = (grown(resident.0, serve), grown(resident.1, worker));
    let started = opts.sessions as u64;
    let (serve_in_flight, worker_in_flight) = match peaks {
        Some(p) => (InFlight::Seen(p.serve), InFlight::Seen(p.worker)),
        None => (InFlight::Started(started), InFlight::Started(started)),
    };
    let per_turn = |kib: u64| kib as f64 / started.max(1) as f64;
    println!(
        "  memory with {} turns started at once: serve {} -> peak {} MiB ({:.1} KiB per turn), worker {} -> peak {} MiB ({:.1} KiB per turn); together {:.1} KiB per turn started{}",
        opts.sessions,
        resident.0 / 1024,
        serve.peak() / 1024,
        per_turn(serve_grew),
        resident.1 / 1024,
        worker.peak() / 1024,
        per_turn(worker_grew),
        per_turn(serve_grew + worker_grew),
        match peaks {
            Some(p) => format!(
                "; in flight at most: serve {} calls ({:.1} KiB resident each), worker {} turns ({:.1} KiB each)",
                p.serve,
                serve_grew as f64 / p.serve.max(1) as f64,
                p.worker,
                worker_grew as f64 / p.worker.max(1) as f64,
            ),
            None => String::new(),
        }
    );
    let mut allocations = allocs_report(
        opts.turns as u64,
        [
            ("serve", allocated_before.0, allocated_after.0),
            ("worker", allocated_before.1, allocated_after.1),
        ],
    );
    if peaks.is_some() {
        allocations.push_str(" (with the in-flight gauges' reads, every 100 ms)");
    }
    println!("{allocations}");
    println!(
        "{}",
        held_report([
            (
                "serve",
                serve_in_flight,
                allocated_before.0,
                allocated_after.0
            ),
            (
                "worker",
                worker_in_flight,
                allocated_before.1,
                allocated_after.1
            ),
        ])
    );
    if let (Some(before), Some(after)) = (commands_before, commands_after) {
        // The difference holds one read of the bench's own (the `INFO` before). Redis counts
        // the commands a script runs as well as the script's call (checked on 7.0), and the
        // processes' own (heartbeats, polls) beside the turns'.
        println!(
            "  commands the private Redis processed per turn: {:.1} (those inside scripts included, and the processes' heartbeats and polls)",
            after.saturating_sub(before + 1) as f64 / opts.turns.max(1) as f64
        );
    }
    if let Some((label, n, kept)) = instructions {
        let turns = opts.turns.max(1) as u64;
        println!(
            "  instructions per turn (callgrind): {label} {} ({n} for {turns} turns, from the first turn on; its CPU seconds above are valgrind's)",
            n / turns
        );
        if let Some(dump) = kept {
            println!(
                "  callgrind profile of the turns: {} (read it with callgrind_annotate; function names need a build that keeps its symbols, e.g. CARGO_PROFILE_RELEASE_STRIP=false)",
                dump.display()
            );
        }
    }
    Ok(())
}

/// The `aptix` binary the processes run: `APTIX_BIN`, else the one beside this binary (cargo
/// builds both into the same directory).
fn aptix_binary() -> anyhow::Result<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("APTIX_BIN") {
        return Ok(path.into());
    }
    let here = std::env::current_exe().context("finding this binary")?;
    let beside = here.with_file_name("aptix");
    anyhow::ensure!(
        beside.exists(),
        "no aptix binary at {} (build it with `cargo build`, or name one in APTIX_BIN)",
        beside.display()
    );
    Ok(beside)
}

#[cfg(test)]
mod tests {
    use super::address_after;

    #[test]
    fn addresses_are_read_from_either_log_line() {
        assert_eq!(
            address_after(
                "INFO aptix::cli::serve: HTTP API listening address=127.0.0.1:4321 worker=false",
                "address="
            )
            .as_deref(),
            Some("127.0.0.1:4321")
        );
        assert_eq!(
            address_after(
                "INFO fake Responses API listening; Ctrl-C stops it base_url=http://127.0.0.1:99/v1",
                "base_url=http://"
            )
            .as_deref(),
            Some("127.0.0.1:99")
        );
        assert_eq!(address_after("no address here", "address="), None);
    }
}
