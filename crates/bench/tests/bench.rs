//! The benchmarks run end to end, from outside, as whoever reproduces docs/benchmarks.md runs
//! them: each prints its figures beside the baseline measured in the same run (the figures
//! themselves are not checked: no timing in tests). They need RabbitMQ and Redis (the local
//! ones, or `APTIX_TEST_AMQP_URL` / `APTIX_TEST_REDIS_URL`) and fail without them.

use std::process::Command;

/// The benchmark binary, with no configuration of the environment the tests run in, and the
/// `aptix` binary beside it (cargo builds the workspace's binaries into one directory; the
/// process bench starts `aptix serve`, `aptix worker` and `aptix fake-llm`).
fn bench() -> Command {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_aptix-bench"));
    let mut c = Command::new(&exe);
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    for var in [
        "APTIX_LLM_BASE_URL",
        "OPENAI_API_KEY",
        "APTIX_AMQP_URL",
        "APTIX_REDIS_URL",
        "APTIX_MODES_FILE",
        "APTIX_CONTEXTS_FILE",
        "APTIX_CONFIG_FILE",
    ] {
        c.env_remove(var);
    }
    c.env("APTIX_BIN", exe.with_file_name("aptix"));
    c
}

fn redis_url() -> String {
    std::env::var("APTIX_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

fn amqp_url() -> String {
    std::env::var("APTIX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// What a bench that exited 0 printed; fails with its output otherwise.
#[track_caller]
fn printed(out: std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Fails naming the first of `lines` that `stdout` lacks.
#[track_caller]
fn assert_lines(stdout: &str, lines: &[&str]) {
    for line in lines {
        assert!(stdout.contains(line), "{line:?} missing from\n{stdout}");
    }
}

/// The streaming and closed-loop benches (in one process, and against separate processes) run
/// end to end on RabbitMQ and Redis and print their figures beside their baselines (the
/// figures themselves are not checked: no timing here).
#[test]
fn the_first_delta_and_closed_loop_benches_run_with_their_baselines() {
    let run = |args: &[&str]| {
        let out = bench()
            .args(args)
            .env("APTIX_AMQP_URL", amqp_url())
            .env("APTIX_REDIS_URL", redis_url())
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        printed(out)
    };
    let first = run(&["turns", "--first-delta", "--turns", "5"]);
    assert_lines(
        &first,
        &[
            "model called directly",
            "client's first NDJSON line",
            "added by the product",
        ],
    );
    let lp = run(&[
        "turns",
        "--closed-loop",
        "--sessions",
        "4",
        "--turns",
        "40",
        "--new-session-per-turn",
        "--baseline-messages",
        "500",
    ]);
    assert_lines(
        &lp,
        &[
            "completed 40 / failed 0",
            "latency, first turn of a session",
            "CPU per turn: aptix",
            "context switches per turn: aptix",
            "RabbitMQ (beam.smp)",
            "free-product ceiling: ",
            "ms per turn across the watched processes",
            "bound by ",
            "baseline, the job leg (quorum queue, persistent, pipelined confirms, acked), 500 messages",
            "baseline, the reply leg (exclusive classic queue, transient, unconfirmed, no-ack consumer), 500 messages",
            "baseline CPU per message (reply): ",
            "is the floor of the services' CPU per turn",
        ],
    );
    // The same loop against `serve`, `worker` and `fake-llm` processes, each measured.
    let procs = run(&[
        "turns",
        "--closed-loop",
        "--processes",
        "--sessions",
        "4",
        "--turns",
        "40",
        "--baseline-messages",
        "500",
    ]);
    assert_lines(
        &procs,
        &[
            "serve, worker and fake model as processes",
            "completed 40 / failed 0",
            "latency, later turns",
            "CPU per turn: aptix serve",
            "aptix worker",
            "the fake model",
            "context switches per turn: aptix serve",
            "memory with 4 turns started at once: serve",
            "free-product ceiling: ",
            "bound by ",
            "baseline, the job leg (quorum queue, persistent, pipelined confirms, acked), 500 messages",
            "baseline, the reply leg (exclusive classic queue, transient, unconfirmed, no-ack consumer), 500 messages",
            "baseline CPU per message (reply): ",
            "is the floor of the services' CPU per turn",
        ],
    );
    // The worker hands every turn between threads: its count of switches cannot be zero.
    let switches = procs
        .lines()
        .find_map(|l| l.trim().strip_prefix("context switches per turn: "))
        .unwrap_or_else(|| panic!("no context switch line in\n{procs}"));
    let worker: f64 = switches
        .split(", ")
        .find_map(|p| p.strip_prefix("aptix worker "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no worker figure in {switches:?}"));
    assert!(worker > 0.0, "{switches}");
    // Five turns of one session with `process` under callgrind, and `more` arguments.
    let counting = |process: &str, more: &[&str]| {
        let mut args = vec![
            "turns",
            "--closed-loop",
            "--processes",
            "--callgrind",
            process,
            "--sessions",
            "1",
            "--turns",
            "5",
            "--baseline-messages",
            "100",
        ];
        args.extend_from_slice(more);
        run(&args)
    };
    // One process under callgrind: its instructions per turn, counted while the turns ran,
    // and its profile kept where it was asked to be.
    let kept =
        std::env::temp_dir().join(format!("aptix-cg-test-{}", uuid::Uuid::new_v4().simple()));
    let kept_arg = kept.to_str().expect("a UTF-8 temp dir");
    let counted = counting("worker", &["--callgrind-out", kept_arg]);
    let profile = counted
        .lines()
        .find_map(|l| l.trim().strip_prefix("callgrind profile of the turns: "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no kept profile named in\n{counted}"));
    assert!(
        profile.starts_with(kept.to_str().unwrap_or_default()),
        "{profile}"
    );
    let dump = std::fs::read_to_string(profile).expect("the kept profile");
    assert!(dump.lines().any(|l| l.starts_with("totals:")), "{profile}");
    std::fs::remove_dir_all(&kept).expect("removes the kept profile");
    // The count a run printed for the process labelled `label`.
    let instructions = |out: &str, label: &str| -> u64 {
        let prefix = format!("instructions per turn (callgrind): {label} ");
        out.lines()
            .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no instruction count for {label} in\n{out}"))
    };
    let per_turn = instructions(&counted, "aptix worker");
    // A turn parses a job, runs Lua scripts' replies, calls the model and publishes: far more
    // than ten thousand instructions; a count that small was not taken over the turns.
    assert!(
        per_turn > 10_000,
        "{per_turn} instructions per turn\n{counted}"
    );
    // The bench's own model can be counted the same way (it shares the cores).
    let fake = counting("fake-llm", &[]);
    let answer = instructions(&fake, "the fake model");
    // Reading a request and writing a Response object: well over ten thousand instructions.
    assert!(answer > 10_000, "{answer} instructions per answer\n{fake}");
    // And Redis: a private server the run starts under callgrind, the product's store on it
    // (the turns completed, so they were stored there: its count is what they cost it).
    let stored = counting("redis", &[]);
    assert!(stored.contains("completed 5 / failed 0"), "{stored}");
    // The turns went to the private server: at least their three script calls each reached it.
    let sent: f64 = stored
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("commands the private Redis processed per turn: ")
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no command count in\n{stored}"));
    assert!(sent >= 3.0, "{sent} commands per turn\n{stored}");
    let scripts = instructions(&stored, "Redis (a private redis-server)");
    // Three Lua scripts a turn, a record passed in and read back: far more than ten thousand.
    assert!(
        scripts > 10_000,
        "{scripts} instructions per turn\n{stored}"
    );
}

#[test]
fn bench_limiter_reports_both_limiters_against_their_baselines() {
    let out = bench()
        .args(["limiter", "--calls", "400", "--callers", "4"])
        .env("APTIX_REDIS_URL", redis_url())
        .output()
        .unwrap();
    assert_lines(
        &printed(out),
        &[
            "baseline: tokio semaphore",
            "baseline: one round trip (PING)",
            "limiter (slot + rate + release)",
            "Redis, 4 caller(s)",
        ],
    );
}

/// The tool-call bench runs against a real MCP server (the official Python SDK's, the one the
/// product's tests use; `.ci/run` installs it and sets `APTIX_MCP_PYTHON`), on Redis, and
/// prints each phase beside the bare call; every call it made reached the server.
#[test]
fn bench_tool_call_reports_a_turn_s_tool_call_against_the_bare_call() {
    let python = std::env::var("APTIX_MCP_PYTHON").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        format!("{home}/.cache/aptix-ci/mcp-2.3.0/bin/python")
    });
    assert!(
        std::path::Path::new(&python).exists(),
        "{python} is missing: install the MCP SDK (`pip install mcp==2.3.0 uvicorn` in a venv; .ci/run does) or set APTIX_MCP_PYTHON"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let state = std::env::temp_dir().join(format!("aptix-bench-mcp-{}", std::process::id()));
    std::fs::create_dir_all(&state).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/mcp/server.py");
    let mut server = Command::new(&python)
        .args([script, "http", &port.to_string()])
        .arg(&state)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the MCP server did not listen"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = bench()
        .args(["tool-call", "--turns", "20", "--tool", "lookup"])
        .args(["--arguments", r#"{"city": "Oslo"}"#])
        .arg("--mcp-url")
        .arg(format!("http://127.0.0.1:{port}/mcp"))
        .env("APTIX_REDIS_URL", redis_url())
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let calls = std::fs::read_to_string(state.join("calls.jsonl")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&state);
    assert_lines(
        &printed(out),
        &[
            "baseline: bare MCP call",
            "turn without a tool call",
            "turn with one MCP tool call",
            "the tool call adds to a turn: latency",
        ],
    );
    // 20 measured and 5 warm-up calls in each of the two phases that call the tool.
    assert_eq!(calls.lines().count(), 50, "{calls}");
}

/// `ops/bench/redis-lua-cost.sh`, as docs/benchmarks.md runs it (fewer calls): a private
/// redis-server under callgrind, a line of instructions per call for each snippet, every
/// snippet's body costing something beyond the empty script's.
#[test]
fn redis_lua_cost_prints_what_each_snippet_costs_beyond_an_empty_script() {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ops/bench/redis-lua-cost.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("50")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let report = format!("{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{report}");
    let costs: Vec<(String, u64)> = text
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once("  ")?;
            let n = rest.split_whitespace().next()?.parse().ok()?;
            Some((name.trim().to_string(), n))
        })
        .collect();
    assert_eq!(costs.len(), 6, "{report}");
    let (first, empty) = &costs[0];
    assert_eq!(first, "empty script", "{report}");
    assert!(*empty > 1_000, "an EVALSHA costs thousands: {report}");
    for (name, n) in &costs[1..] {
        assert!(n > empty, "{name} costs its body too: {report}");
    }
}
