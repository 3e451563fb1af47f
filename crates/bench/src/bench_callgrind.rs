//! `aptix-bench turns --closed-loop --processes --callgrind worker|serve|fake-llm|redis`: one of
//! the processes runs under valgrind's callgrind, and the run reports the instructions it
//! executed per turn (`redis`: a private `redis-server` started for the run, the product's store
//! on it, so that what a turn costs Redis — its scripts among it — is counted too). Unlike CPU
//! seconds on a shared machine (which move by a fifth from run to run with what else the host
//! does), the count repeats within a fraction of a percent for the same build, so two builds
//! can be compared by a few hundred turns of each. Valgrind counts each byte a `rep movsb`
//! copies as an instruction, so code that copies much weighs more than its share of seconds.
//!
//! Owns: wrapping the counted process and reading its count. Must not: drive the turns (that
//! is the closed loop's).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

/// `APTIX_DEPENDENCY_TIMEOUT_MS` of the process run under valgrind (3 s by default).
const UNDER_VALGRIND_TIMEOUT_MS: &str = "60000";

/// The process whose instructions are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Counted {
    /// `aptix worker`.
    Worker,
    /// `aptix serve`.
    Serve,
    /// `aptix fake-llm`, the bench's stand-in for the model (part of the harness, not the
    /// product, but it shares the cores).
    FakeLlm,
    /// A private `redis-server` (from `PATH`) the run starts on a port of its own, with
    /// nothing kept on disk; serve and worker use it as their store (`APTIX_REDIS_URL`).
    Redis,
}

/// Callgrind's output for one run: a directory of the run's own, removed when dropped, or
/// one the caller named (`--callgrind-out`), kept for `callgrind_annotate`.
pub struct Callgrind {
    pub counted: Counted,
    dir: PathBuf,
    keep: bool,
}

impl Callgrind {
    pub fn new(counted: Counted, out: Option<&Path>) -> anyhow::Result<Self> {
        let (dir, keep) = match out {
            Some(dir) => (dir.to_path_buf(), true),
            None => (
                std::env::temp_dir()
                    .join(format!("aptix-callgrind-{}", uuid::Uuid::new_v4().simple())),
                false,
            ),
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self { counted, dir, keep })
    }

    /// The command that runs `exe args…` under callgrind when `which` is the counted process,
    /// else `exe args…`.
    pub fn command(this: Option<&Self>, which: Counted, exe: &Path, args: &[&str]) -> Command {
        match this {
            Some(cg) if cg.counted == which => {
                let mut cmd = Command::new("valgrind");
                // Under valgrind a process runs tens of times slower, and more so on a loaded
                // machine: its own bounds on a Redis command or a RabbitMQ operation (its
                // connection at start-up among them) are stretched alike, so that what is
                // counted is its work, not its giving up.
                cmd.env("APTIX_DEPENDENCY_TIMEOUT_MS", UNDER_VALGRIND_TIMEOUT_MS)
                    .arg("--tool=callgrind")
                    .arg(format!(
                        "--callgrind-out-file={}",
                        cg.dir.join("callgrind.out.%p").display()
                    ))
                    .arg(exe)
                    .args(args);
                cmd
            }
            _ => {
                let mut cmd = Command::new(exe);
                cmd.args(args);
                cmd
            }
        }
    }

    /// Sets the counted process's counts to zero (`callgrind_control -z`).
    pub fn zero(&self, pid: u32) -> anyhow::Result<()> {
        control(pid, "-z")
    }

    /// The instructions the counted process executed since [`Callgrind::zero`], and the dump
    /// they were read from: has it write its counts (`callgrind_control -d`) and reads their
    /// total. The dump stays when the directory is kept.
    pub fn instructions(&self, pid: u32) -> anyhow::Result<(u64, PathBuf)> {
        control(pid, "-d")?;
        // The dump is written by the process itself; its total is its last line.
        for _ in 0..100 {
            if let Some(found) = self.latest_total(pid)? {
                return Ok(found);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        anyhow::bail!("callgrind wrote no counts in {}", self.dir.display())
    }

    /// Whether the dumps stay after the run.
    pub fn kept(&self) -> bool {
        self.keep
    }

    /// The total of the process's newest dump (`callgrind.out.<pid>.<n>`), once it is written
    /// out. Only the process's own dumps count: a kept directory may hold earlier runs'.
    fn latest_total(&self, pid: u32) -> anyhow::Result<Option<(u64, PathBuf)>> {
        let own = format!("callgrind.out.{pid}.");
        let mut dumps: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&self.dir)?
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with(&own))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        dumps.sort();
        let Some((_, newest)) = dumps.pop() else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(&newest)?;
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix("totals:"))
            .and_then(|v| v.trim().parse().ok())
            .map(|total| (total, newest)))
    }
}

impl Drop for Callgrind {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn control(pid: u32, what: &str) -> anyhow::Result<()> {
    let status = Command::new("callgrind_control")
        .args([what, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .context("running callgrind_control (from valgrind)")?;
    anyhow::ensure!(status.success(), "callgrind_control {what} {pid} failed");
    Ok(())
}
