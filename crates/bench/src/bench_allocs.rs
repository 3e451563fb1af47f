//! Allocations per turn of serve and worker, and the heap each turn in flight holds: read from
//! their `/metrics` before and after the turns, when the `aptix` binary counts them (built
//! with `--features count-allocations`; `aptix_allocations_total`,
//! `aptix_allocated_bytes_total`, `aptix_heap_held_bytes`, `aptix_heap_held_peak_bytes`). A
//! build that does not count shows none of them, and the run says how to get them.

/// What a process had allocated at one scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocated {
    /// Allocations and reallocations.
    pub allocations: u64,
    /// Bytes they asked for.
    pub bytes: u64,
    /// Heap bytes held at the scrape.
    pub held: u64,
    /// The most heap bytes held at once since the process started.
    pub held_peak: u64,
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

/// The counting allocator's samples in an exposition, when all four are there.
fn read(text: &str) -> Option<Allocated> {
    Some(Allocated {
        allocations: counter(text, "aptix_allocations_total")?,
        bytes: counter(text, "aptix_allocated_bytes_total")?,
        held: counter(text, "aptix_heap_held_bytes")?,
        held_peak: counter(text, "aptix_heap_held_peak_bytes")?,
    })
}

/// The value of the sample `name` (one without labels) in a text exposition.
fn counter(text: &str, name: &str) -> Option<u64> {
    super::bench_in_flight::gauge_sum(text, name, None)
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

/// How many turns a process's heap is divided by: the most it held at once (read from its
/// gauge while the turns ran), or, where that was not read, the turns started at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlight {
    /// The most in flight at once, as the process's own gauge showed.
    Seen(u64),
    /// The turns started at once (not read from the process: an upper bound).
    Started(u64),
}

impl InFlight {
    fn count(self) -> u64 {
        match self {
            Self::Seen(n) | Self::Started(n) => n.max(1),
        }
    }
}

/// The line the run prints about memory: the heap each turn in flight held at the process's
/// peak, over what it held before the turns (host-independent, unlike resident memory: no
/// allocator's slack or pages not given back). A peak the turns did not raise says so (it
/// was set before them, at start-up).
pub fn held_report(counted: [(&str, InFlight, Option<Allocated>, Option<Allocated>); 2]) -> String {
    let mut parts = Vec::new();
    for (label, in_flight, before, after) in counted {
        let (Some(before), Some(after)) = (before, after) else {
            return "  heap held per turn in flight: not counted (build aptix with `--features count-allocations` and name it in APTIX_BIN)".into();
        };
        let n = in_flight.count();
        let over = match in_flight {
            InFlight::Seen(n) => format!("{n} in flight at most"),
            InFlight::Started(n) => format!("{n} started at once"),
        };
        if after.held_peak <= before.held_peak {
            parts.push(format!(
                "{label} peak not raised by the turns (at most {:.1} KiB; {over})",
                before.held_peak.saturating_sub(before.held) as f64 / 1024.0 / n as f64
            ));
        } else {
            let grown = after.held_peak.saturating_sub(before.held);
            parts.push(format!(
                "{label} {:.1} KiB ({over}; {} -> peak {} KiB)",
                grown as f64 / 1024.0 / n as f64,
                before.held / 1024,
                after.held_peak / 1024
            ));
        }
    }
    format!(
        "  heap held per turn in flight (counting allocator, peak over before): {}",
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
        # TYPE aptix_heap_held_bytes gauge\n\
        aptix_heap_held_bytes 5120000\n\
        aptix_heap_held_peak_bytes 9000000\n\
        # EOF\n";

    #[test]
    fn both_counters_are_read_and_a_build_without_them_counts_nothing() {
        assert_eq!(
            read(EXPOSITION),
            Some(Allocated {
                allocations: 70_941,
                bytes: 22_039_346,
                held: 5_120_000,
                held_peak: 9_000_000,
            })
        );
        assert_eq!(read("aptix_turns_total 3\n# EOF\n"), None);
    }

    #[test]
    fn the_report_divides_what_each_process_added_by_the_turns() {
        let at = |allocations, bytes| {
            Some(Allocated {
                allocations,
                bytes,
                held: 0,
                held_peak: 0,
            })
        };
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

    #[test]
    fn the_heap_report_divides_the_peak_over_before_by_the_turns_in_flight() {
        let at = |held, held_peak| {
            Some(Allocated {
                allocations: 0,
                bytes: 0,
                held,
                held_peak,
            })
        };
        let line = held_report([
            (
                "serve",
                InFlight::Seen(100),
                at(1 << 20, (1 << 20) + 1000),
                at(1 << 20, (1 << 20) + 409_600),
            ),
            (
                "worker",
                InFlight::Started(100),
                at(3 << 20, 5 << 20),
                at(3 << 20, 5 << 20),
            ),
        ]);
        assert!(
            line.ends_with("serve 4.0 KiB (100 in flight at most; 1024 -> peak 1424 KiB), worker peak not raised by the turns (at most 20.5 KiB; 100 started at once)"),
            "{line}"
        );
        // Half as many in flight: twice the heap each.
        let half = held_report([
            (
                "serve",
                InFlight::Seen(50),
                at(1 << 20, 1 << 20),
                at(1 << 20, (1 << 20) + 409_600),
            ),
            ("worker", InFlight::Seen(0), at(0, 0), at(0, 1024)),
        ]);
        assert!(
            half.contains("serve 8.0 KiB (50 in flight at most"),
            "{half}"
        );
        assert!(
            half.contains("worker 1.0 KiB (0 in flight at most"),
            "{half}"
        );
        let none = (InFlight::Started(1), None, None);
        assert!(
            held_report([
                ("serve", none.0, none.1, none.2),
                ("worker", none.0, None, None)
            ])
            .contains("not counted")
        );
    }
}
