//! `APTIX_CPU_SCHEDULING`: the class every thread of `aptix serve` and `aptix worker` runs in,
//! read from the kernel, and a refused class as a warning. In the `it` binary only: the
//! refused-class process starts in `SCHED_IDLE`, which a binary keeping both cores busy (the
//! bounded-state one) would starve past any start deadline.

use std::time::Duration;

use crate::processes::Processes;
use crate::support::{Listening, http_client};

/// Each thread of process `pid`: its name and its scheduling policy as the kernel reports it
/// (`/proc/<pid>/task/<tid>/stat`, field 41: 0 normal, 3 batch).
#[cfg(target_os = "linux")]
fn thread_policies(pid: u32) -> Vec<(String, u32)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        // A thread that ended since the directory was read (an idle blocking-pool thread,
        // say) has no files left to read: it is not one of the process's threads any more.
        let (Ok(name), Ok(stat)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("stat")),
        ) else {
            continue;
        };
        // The fields after the name, which ends with the last ')': field 3 is the first.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        threads.push((name.trim().to_string(), fields[41 - 3].parse().unwrap()));
    }
    threads
}

/// `APTIX_CPU_SCHEDULING=batch` puts every thread of `aptix serve` and `aptix worker` in
/// SCHED_BATCH — the runtime's and lapin's I/O thread included, as the kernel reports them —
/// and says so in the log; the processes run turns as before. Without it, every thread keeps
/// the normal class. A class it does not know stops a long-running process, naming the
/// variable; a client command does not read it.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn cpu_scheduling_batch_reaches_every_thread_of_serve_and_worker() {
    const BATCH: u32 = 3;
    const NORMAL: u32 = 0;
    let turn = |session: &str| {
        format!(r#"{{"sessionId": "{session}", "turnId": "t", "instruction": "hello"}}"#)
    };
    let batch = Processes::start(vec![("APTIX_CPU_SCHEDULING", "batch".into())], &[], 1).await;
    batch.submit(turn("sched-batch")).await;
    batch.wait_completed("sched-batch").await;
    for process in [&batch.serve, &batch.workers[0]] {
        let threads = thread_policies(process.child.id());
        assert!(
            threads.iter().any(|(name, _)| name == "lapin-io-loop"),
            "{threads:?}"
        );
        assert!(
            threads.iter().all(|(_, policy)| *policy == BATCH),
            "{threads:?}"
        );
        assert!(
            process
                .lines()
                .iter()
                .any(|l| l.contains("CPU scheduling: SCHED_BATCH")),
            "{:?}",
            process.lines()
        );
    }
    drop(batch);

    let normal = Processes::start(Vec::new(), &[], 1).await;
    normal.submit(turn("sched-normal")).await;
    normal.wait_completed("sched-normal").await;
    for process in [&normal.serve, &normal.workers[0]] {
        let threads = thread_policies(process.child.id());
        assert!(
            threads.iter().all(|(_, policy)| *policy == NORMAL),
            "{threads:?}"
        );
    }
    drop(normal);

    let out = crate::support::aptix()
        .arg("worker")
        .env("APTIX_CPU_SCHEDULING", "fifo")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("APTIX_CPU_SCHEDULING") && stderr.contains("fifo"),
        "{stderr}"
    );
    let out = crate::support::aptix()
        .arg("modes")
        .env("APTIX_CPU_SCHEDULING", "fifo")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// When the kernel refuses `APTIX_CPU_SCHEDULING=batch` the process says so and works on in
/// the class it started in. The refusal is made real: the process starts in `SCHED_IDLE`,
/// which an unprivileged thread may leave only within its `RLIMIT_NICE` (set to nothing here),
/// and without `CAP_SYS_NICE` (dropped from the bounding set when the tests run as root).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_refused_cpu_scheduling_class_is_a_warning_and_the_process_serves_on() {
    const IDLE: u32 = 5;
    let mut wrapped = std::process::Command::new("chrt");
    wrapped.args(["--idle", "0"]);
    // SAFETY: geteuid reads the calling process's effective user id; it cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        wrapped.args([
            "setpriv",
            "--inh-caps=-sys_nice",
            "--bounding-set=-sys_nice",
        ]);
    }
    wrapped
        .args(["prlimit", "--nice=0:0"])
        .arg(env!("CARGO_BIN_EXE_aptix"))
        .args(["serve", "--worker", "--listen", "127.0.0.1:0"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("APTIX_CPU_SCHEDULING", "batch")
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1");
    for var in ["APTIX_AMQP_URL", "APTIX_REDIS_URL", "APTIX_LLM_BASE_URL"] {
        wrapped.env_remove(var);
    }
    // SCHED_IDLE gets the CPU only when nothing else wants it: the other tests of the binary
    // may keep it waiting well past the usual deadline.
    let serve = Listening::start_within(&mut wrapped, Duration::from_secs(180));
    let warning = serve
        .lines()
        .into_iter()
        .find(|l| l.contains("CPU scheduling class left as it was"));
    let Some(warning) = warning else {
        panic!("no warning: {:?}", serve.lines());
    };
    assert!(
        warning.contains("WARN")
            && warning.contains("cannot apply APTIX_CPU_SCHEDULING=batch")
            && warning.contains("os error 1"),
        "{warning}"
    );
    assert!(
        !serve
            .lines()
            .iter()
            .any(|l| l.contains("CPU scheduling: SCHED_BATCH")),
        "{:?}",
        serve.lines()
    );
    let threads = thread_policies(serve.child.id());
    assert!(
        threads.iter().all(|(_, policy)| *policy == IDLE),
        "{threads:?}"
    );
    // It still runs turns: one, in the embedded queue and store, answered by the model.
    let resp = http_client()
        .post(format!("{}/api/ai/agent/execute", serve.url()))
        .body(r#"{"sessionId": "sched-refused", "turnId": "t", "instruction": "hello"}"#)
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.text().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"final\""), "{body}");
}
