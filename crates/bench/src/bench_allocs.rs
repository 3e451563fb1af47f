//! Allocations per turn of serve and worker: read from their `/metrics` before and after the
//! turns, when the `aptix` binary counts them (built with `--features count-allocations`;
//! `aptix_allocations_total`, `aptix_allocated_bytes_total`). A build that does not count
//! shows neither, and the run says how to get them.

/// What a process had allocated at one scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocated {
    /// Allocations and reallocations.
    pub allocations: u64,
    /// Bytes they asked for.
    pub bytes: u64,
}

/// What the process at `address` (`host:port`) reports, or `None` when it does not count
/// (or cannot be read: the run then says the figure is missing, not zero).
pub async fn scrape(client: &reqwest::Client, address: &str) -> Option<Allocated> {
    let text = client
        .get(format!("http://{address}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    read(&text)
}

/// The two counters of an exposition, when both are there.
fn read(text: &str) -> Option<Allocated> {
    Some(Allocated {
        allocations: counter(text, "aptix_allocations_total")?,
        bytes: counter(text, "aptix_allocated_bytes_total")?,
    })
}

/// The value of the sample `name` (one without labels) in a text exposition.
fn counter(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(' ')?;
        value.trim().parse::<f64>().ok().map(|v| v as u64)
    })
}

/// The line the run prints: each process's allocations and bytes per turn over `turns`.
pub fn report(turns: u64, counted: [(&str, Option<Allocated>, Option<Allocated>); 2]) -> String {
    let turns = turns.max(1);
    let mut parts = Vec::new();
    for (label, before, after) in counted {
        let (Some(before), Some(after)) = (before, after) else {
            return "  allocations per turn: not counted (build aptix with `--features count-allocations` and name it in APTIX_BIN)".into();
        };
        let n = after.allocations.saturating_sub(before.allocations);
        let bytes = after.bytes.saturating_sub(before.bytes);
        parts.push(format!("{label} {} ({} bytes)", n / turns, bytes / turns));
    }
    format!(
        "  allocations per turn (counting allocator, /metrics before and after): {}",
        parts.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = "# HELP aptix_allocations Heap allocations\n\
        # TYPE aptix_allocations counter\n\
        aptix_allocations_total 70941\n\
        # TYPE aptix_allocated_bytes counter\n\
        aptix_allocated_bytes_total 22039346\n\
        aptix_allocations_totalled_elsewhere 5\n\
        # EOF\n";

    #[test]
    fn both_counters_are_read_and_a_build_without_them_counts_nothing() {
        assert_eq!(
            read(EXPOSITION),
            Some(Allocated {
                allocations: 70_941,
                bytes: 22_039_346
            })
        );
        assert_eq!(read("aptix_turns_total 3\n# EOF\n"), None);
    }

    #[test]
    fn the_report_divides_what_each_process_added_by_the_turns() {
        let at = |allocations, bytes| Some(Allocated { allocations, bytes });
        let line = report(
            100,
            [
                ("serve", at(1_000, 50_000), at(31_000, 2_050_000)),
                ("worker", at(5, 5), at(80_005, 9_000_005)),
            ],
        );
        assert!(
            line.ends_with("serve 300 (20000 bytes), worker 800 (90000 bytes)"),
            "{line}"
        );
        let missing = report(100, [("serve", at(1, 1), None), ("worker", None, None)]);
        assert!(missing.contains("not counted"), "{missing}");
    }
}
