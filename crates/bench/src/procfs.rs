//! What the benchmarks read of `/proc`: a process's CPU seconds, context switches and memory,
//! the processes of a name, and snapshots of the watched processes before and after a run with
//! the figures per turn between them.

use super::bench_verdict::{Part, Split};

/// CPU seconds (user + system) a process has used, from `/proc/<pid>/stat`.
pub(super) fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Processes whose command name is `comm`.
pub(super) fn pids_named(comm: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .collect()
}

/// Resident memory of the processes named `comm`, in KiB.
pub(super) fn rss_kib(comm: &str) -> u64 {
    pids_named(comm)
        .into_iter()
        .filter_map(|pid| status_kib(pid, "VmRSS:"))
        .sum()
}

/// A memory figure of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:` for the peak), in KiB.
pub(super) fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()
}

/// Context switches of every thread of process `pid` so far, voluntary (it waited) and
/// involuntary (it was preempted) together.
pub(super) fn context_switches(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0;
    for task in tasks.filter_map(Result::ok) {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue; // the thread ended since the directory was read
        };
        total += status
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Some(total)
}

/// What one watched process (or group of processes) has used so far.
pub(super) struct Usage {
    label: String,
    part: Part,
    cpu_seconds: f64,
    switches: u64,
}

/// The usage of each watched process, in order.
pub(super) type CpuSnapshot = Vec<Usage>;

/// A watched process: its label, what it is to the measure, its pids.
pub(super) type Watched = (&'static str, Part, Vec<u32>);

/// The usage of `watched` processes, and of RabbitMQ and Redis.
pub(super) fn cpu_snapshot(watched: &[Watched]) -> CpuSnapshot {
    let usage = |label: &str, part: Part, pids: &[u32]| Usage {
        label: label.to_string(),
        part,
        cpu_seconds: pids.iter().copied().filter_map(cpu_seconds).sum(),
        switches: pids.iter().copied().filter_map(context_switches).sum(),
    };
    watched
        .iter()
        .map(|(label, part, pids)| usage(label, *part, pids))
        .chain([
            usage(
                "RabbitMQ (beam.smp)",
                Part::Services,
                &pids_named("beam.smp"),
            ),
            usage(
                "Redis (redis-server)",
                Part::Services,
                &pids_named("redis-server"),
            ),
        ])
        .collect()
}

/// CPU milliseconds per unit of work of each [`Part`] between two snapshots.
pub(super) fn split_per(before: &CpuSnapshot, after: &CpuSnapshot, n: usize) -> Split {
    let ms = |part: Part| -> f64 {
        before
            .iter()
            .zip(after)
            .filter(|(b, _)| b.part == part)
            .map(|(b, a)| (a.cpu_seconds - b.cpu_seconds) * 1000.0 / n.max(1) as f64)
            .sum()
    };
    Split {
        product: ms(Part::Product),
        services: ms(Part::Services),
        harness: ms(Part::Harness),
        mixed: ms(Part::ProductAndHarness),
    }
}

/// This process alone, as the in-process runs watch it.
pub(super) fn in_process() -> Vec<Watched> {
    vec![(
        "aptix (front door + worker + fake model)",
        Part::ProductAndHarness,
        vec![std::process::id()],
    )]
}

pub(super) fn cpu_per(before: &CpuSnapshot, after: &CpuSnapshot, n: usize) -> String {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            let ms = (a.cpu_seconds - b.cpu_seconds) * 1000.0 / n.max(1) as f64;
            format!("{} {ms:.3} ms", b.label)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Context switches per unit of work (all threads of each process): each is a hand-over
/// between threads or a preemption, and on shared cores they cost as much as the work.
pub(super) fn switches_per(before: &CpuSnapshot, after: &CpuSnapshot, n: usize) -> String {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            let per = a.switches.saturating_sub(b.switches) as f64 / n.max(1) as f64;
            format!("{} {per:.2}", b.label)
        })
        .collect::<Vec<_>>()
        .join(", ")
}
