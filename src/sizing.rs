//! How many turns a worker runs at once by default: a quarter of the memory the process may
//! use (its cgroup's limit, else the machine's) at what one turn in flight costs.
//!
//! Owns: that arithmetic and the memory probe. Must not: read configuration.

/// What one turn in flight may cost a worker, for sizing the default concurrency: measured
/// 13.3–16.0 KiB of heap and 16–19 KiB resident with the model over HTTP/1.1, 15.5–18.3 KiB
/// of heap and 21–26 KiB resident over HTTP/2, with 2,000, 8,000 and 10,000 new sessions at
/// once (`aptix-bench turns --closed-loop`; docs/benchmarks.md, 2026-12-07, evening; four
/// runs at 10,000 on 2026-12-08 spread 15.3–20.0 KiB of heap over HTTP/1.1), rounded
/// up for the allocator's slack, a model's longer answers and retrieved context (a turn with
/// retrieved context holds its chunks through the wait).
pub const MEMORY_PER_TURN: u64 = 32 << 10;
/// The default concurrency never goes below this or above [`MAX_DEFAULT_CONCURRENCY`].
pub const MIN_DEFAULT_CONCURRENCY: usize = 64;
/// See [`MIN_DEFAULT_CONCURRENCY`].
pub const MAX_DEFAULT_CONCURRENCY: usize = 8192;

/// Turns one worker runs at once unless `APTIX_CONCURRENCY` says otherwise, for a process that
/// may use `memory` bytes: a turn spends nearly all its time waiting on the model, so a worker
/// is bound by how many turns it holds, not by CPU. A quarter of the memory at
/// [`MEMORY_PER_TURN`] each, between 64 and 8,192 (8,192 keep a 2 s model busy at ~4,000
/// turns/s, more than a worker core runs); the model servers are protected by each agent
/// context's own limits, not by this number.
pub fn concurrency_for_memory(memory: u64) -> usize {
    let fits = memory / 4 / MEMORY_PER_TURN;
    usize::try_from(fits)
        .unwrap_or(usize::MAX)
        .clamp(MIN_DEFAULT_CONCURRENCY, MAX_DEFAULT_CONCURRENCY)
}

/// The memory this process may use: its cgroup's limit (a container's), else the machine's.
pub fn memory_limit() -> Option<u64> {
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|path| std::fs::read_to_string(path).ok())
    .filter_map(|text| text.trim().parse::<u64>().ok())
    // cgroup v1 says "no limit" with a number near u64::MAX.
    .find(|limit| *limit < 1 << 50);
    cgroup.or_else(|| {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    })
}

/// The default concurrency on this machine or in this container ([`concurrency_for_memory`];
/// 1,024 where the memory cannot be read).
pub fn default_concurrency() -> usize {
    memory_limit().map_or(1024, concurrency_for_memory)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_concurrency_is_a_quarter_of_the_memory_within_bounds() {
        const MIB: u64 = 1 << 20;
        // 256 MiB: 64 MiB for turns at 32 KiB each.
        assert_eq!(concurrency_for_memory(256 * MIB), 2048);
        assert_eq!(concurrency_for_memory(512 * MIB), 4096);
        assert_eq!(concurrency_for_memory(1024 * MIB), MAX_DEFAULT_CONCURRENCY);
        assert_eq!(
            concurrency_for_memory(64 * 1024 * MIB),
            MAX_DEFAULT_CONCURRENCY
        );
        assert_eq!(concurrency_for_memory(4 * MIB), MIN_DEFAULT_CONCURRENCY);
        assert!(
            memory_limit().is_some_and(|m| m > 0),
            "this machine's memory is readable"
        );
    }

    /// The manifests add a worker per default concurrency's worth of waiting jobs: the
    /// scaler's figure is what a worker at the deployment's memory limit runs at once.
    #[test]
    fn the_scaler_adds_a_worker_per_default_concurrency_at_the_deployments_limit() {
        use yaml_rust2::{Yaml, YamlLoader};
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/ops/k8s/worker.yaml");
        let text = std::fs::read_to_string(path).expect("the worker's manifest");
        let docs = YamlLoader::load_from_str(&text).expect("YAML");
        let kind = |d: &&Yaml| d["kind"].as_str().map(str::to_owned);
        let deployment = docs
            .iter()
            .find(|d| kind(d).as_deref() == Some("Deployment"));
        let limit = deployment.expect("a Deployment")["spec"]["template"]["spec"]["containers"][0]
            ["resources"]["limits"]["memory"]
            .as_str()
            .expect("a memory limit");
        let gib: u64 = limit
            .strip_suffix("Gi")
            .and_then(|n| n.parse().ok())
            .expect("in Gi");
        let scaler = docs
            .iter()
            .find(|d| kind(d).as_deref() == Some("ScaledObject"));
        let per_worker: usize = scaler.expect("a ScaledObject")["spec"]["triggers"][0]["metadata"]
            ["value"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .expect("a queue length");
        assert_eq!(per_worker, concurrency_for_memory(gib << 30));
    }
}
