//! The closed loop's verdict: the figure against the throughput target, and what bounds it —
//! the clients' own ceiling, the CPU the watched processes spent, or the time a turn waits
//! outside the model. Pure arithmetic on what the run measured, so it is tested here with
//! made-up runs; no measured figure is asserted anywhere.

use std::time::Duration;

/// Turns per second the services path is to sustain on the CI machine kind (two shared cores),
/// on both shapes and at both model latencies.
pub(super) const TARGET_TURNS_PER_SEC: f64 = 2000.0;

/// Above this share of the machine's cores busy, a turn's waits between processes lengthen
/// with the load (measured: at ~75 % busy the path outside a 200 ms model was ~80 ms, at ~25 %
/// ~13 ms; docs/benchmarks.md, round six).
const BUSY: f64 = 0.7;

/// What a closed-loop run measured.
#[derive(Debug, Clone)]
pub(super) struct Measured {
    /// Turns completed per second.
    pub rate: f64,
    /// Clients in the loop (each waits for its turn's answer before sending the next).
    pub clients: usize,
    /// The fake model's latency.
    pub model: Duration,
    /// Median end-to-end latency of a turn.
    pub p50: Duration,
    /// CPU per turn of every watched process together (ms).
    pub cpu_ms_per_turn: f64,
    /// Cores of the machine.
    pub cores: usize,
}

/// The verdict's lines, most important first.
pub(super) fn verdict(m: &Measured) -> Vec<String> {
    let mut lines = Vec::with_capacity(3);
    let share = m.rate / TARGET_TURNS_PER_SEC * 100.0;
    lines.push(if m.rate >= TARGET_TURNS_PER_SEC {
        format!(
            "target >= {TARGET_TURNS_PER_SEC:.0} turns/s: met ({:.0} turns/s)",
            m.rate
        )
    } else {
        format!(
            "target >= {TARGET_TURNS_PER_SEC:.0} turns/s: NOT met ({:.0} turns/s, {share:.0} % of it)",
            m.rate
        )
    });
    let cores = m.cores.max(1) as f64;
    let busy = m.cpu_ms_per_turn * m.rate / 1000.0;
    lines.push(format!(
        "CPU: {:.3} ms per turn across the watched processes, {busy:.2} of {cores:.0} cores busy ({:.0} %)",
        m.cpu_ms_per_turn,
        busy / cores * 100.0
    ));
    let model_s = m.model.as_secs_f64();
    let path_ms = m.p50.saturating_sub(m.model).as_secs_f64() * 1000.0;
    let clients = m.clients as f64;
    // A closed loop of `clients` at a model of `model_s` cannot pass clients / model_s.
    if model_s > 0.0 && clients / model_s < TARGET_TURNS_PER_SEC {
        lines.push(format!(
            "bound by the clients: {} clients waiting {} ms per turn for the model reach at most {:.0} turns/s; the target needs at least {:.0}",
            m.clients,
            m.model.as_millis(),
            clients / model_s,
            (TARGET_TURNS_PER_SEC * model_s).ceil()
        ));
    } else if busy / cores >= BUSY {
        lines.push(format!(
            "bound by CPU: the target at {:.3} ms per turn would keep {:.2} cores busy; a turn waits {path_ms:.0} ms (p50) outside the model, most of it for a core",
            m.cpu_ms_per_turn,
            m.cpu_ms_per_turn * TARGET_TURNS_PER_SEC / 1000.0
        ));
    } else {
        lines.push(format!(
            "bound by waiting, not CPU: a turn spends {path_ms:.0} ms (p50) outside the model in exchanges between processes; fewer exchanges in a row, not less CPU, raise this figure"
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rate: f64, clients: usize, model_ms: u64, p50_ms: u64, cpu: f64) -> Measured {
        Measured {
            rate,
            clients,
            model: Duration::from_millis(model_ms),
            p50: Duration::from_millis(p50_ms),
            cpu_ms_per_turn: cpu,
            cores: 2,
        }
    }

    #[test]
    fn a_run_at_the_target_is_met_and_one_below_is_not() {
        let met = verdict(&run(2100.0, 500, 0, 200, 0.6));
        assert_eq!(met[0], "target >= 2000 turns/s: met (2100 turns/s)");
        let not = verdict(&run(1550.0, 500, 200, 314, 1.0));
        assert_eq!(
            not[0],
            "target >= 2000 turns/s: NOT met (1550 turns/s, 78 % of it)"
        );
    }

    #[test]
    fn the_cores_busy_are_the_cpu_per_turn_times_the_rate() {
        let v = verdict(&run(1550.0, 500, 200, 314, 1.0));
        assert_eq!(
            v[1],
            "CPU: 1.000 ms per turn across the watched processes, 1.55 of 2 cores busy (78 %)"
        );
    }

    #[test]
    fn a_full_machine_is_bound_by_cpu_and_says_what_the_target_would_take() {
        let v = verdict(&run(1550.0, 500, 200, 314, 1.0));
        assert!(v[2].starts_with("bound by CPU: "), "{v:?}");
        assert!(v[2].contains("2.00 cores busy"), "{v:?}");
        assert!(v[2].contains("waits 114 ms (p50)"), "{v:?}");
    }

    #[test]
    fn an_idle_machine_is_bound_by_waiting() {
        let v = verdict(&run(800.0, 500, 200, 600, 0.5));
        assert!(v[2].starts_with("bound by waiting"), "{v:?}");
        assert!(v[2].contains("400 ms (p50)"), "{v:?}");
    }

    #[test]
    fn too_few_clients_for_the_model_latency_is_said_first() {
        // 200 clients at 200 ms can never pass 1,000 turns/s, however idle the machine.
        let v = verdict(&run(900.0, 200, 200, 222, 1.0));
        assert!(v[2].starts_with("bound by the clients: "), "{v:?}");
        assert!(v[2].contains("at most 1000 turns/s"), "{v:?}");
        assert!(v[2].contains("needs at least 400"), "{v:?}");
    }
}
