//! The closed loop's verdict: the figure against the throughput target, and what bounds it —
//! the clients' own ceiling, the CPU the watched processes spent (and then what the target
//! leaves the product once the services and the harness have had theirs), or the time a turn
//! waits outside the model. Pure arithmetic on what the run measured, so it is tested here with
//! made-up runs; no measured figure is asserted anywhere.

use std::time::Duration;

/// Turns per second the services path is to sustain on the CI machine kind (two shared cores),
/// on both shapes and at both model latencies.
pub(super) const TARGET_TURNS_PER_SEC: f64 = 2000.0;

/// Above this share of the machine's cores busy, a turn's waits between processes lengthen
/// with the load (measured: at ~75 % busy the path outside a 200 ms model was ~80 ms, at ~25 %
/// ~13 ms; docs/benchmarks-journal.md, round six).
const BUSY: f64 = 0.7;

/// What a watched process is to the measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// The product: a front door, a worker.
    Product,
    /// What the product runs on: RabbitMQ, Redis.
    Services,
    /// The bench's stand-ins for the world: the fake model, the HTTP clients.
    Harness,
    /// Product and harness in one process (the one-process layout): not told apart.
    ProductAndHarness,
}

/// CPU milliseconds per turn of each [`Part`].
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Split {
    /// Front door and worker.
    pub product: f64,
    /// RabbitMQ and Redis.
    pub services: f64,
    /// The fake model and the clients.
    pub harness: f64,
    /// Product and harness in one process.
    pub mixed: f64,
}

impl Split {
    /// Every watched process together.
    pub fn total(&self) -> f64 {
        self.product + self.services + self.harness + self.mixed
    }
}

/// What a closed-loop run measured.
#[derive(Debug, Clone)]
pub(super) struct Measured {
    /// Where the CPU per turn went.
    pub split: Split,
    /// Turns completed per second.
    pub rate: f64,
    /// Clients in the loop (each waits for its turn's answer before sending the next).
    pub clients: usize,
    /// The fake model's latency.
    pub model: Duration,
    /// Median end-to-end latency of a turn.
    pub p50: Duration,
    /// Cores of the machine.
    pub cores: usize,
}

/// The verdict's lines, most important first.
pub(super) fn verdict(m: &Measured) -> Vec<String> {
    let mut lines = Vec::with_capacity(4);
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
    let cpu_ms_per_turn = m.split.total();
    let busy = cpu_ms_per_turn * m.rate / 1000.0;
    lines.push(format!(
        "CPU: {:.3} ms per turn across the watched processes, {busy:.2} of {cores:.0} cores busy ({:.0} %)",
        cpu_ms_per_turn,
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
            cpu_ms_per_turn,
            cpu_ms_per_turn * TARGET_TURNS_PER_SEC / 1000.0
        ));
        lines.push(budget(&m.split, cores));
    } else {
        lines.push(format!(
            "bound by waiting, not CPU: a turn spends {path_ms:.0} ms (p50) outside the model in exchanges between processes; fewer exchanges in a row, not less CPU, raise this figure"
        ));
    }
    lines
}

/// What the target leaves the product of the machine's cores, once the services and the
/// harness have had what they take per turn — the share of a CPU-bound figure the product's
/// own code can move on this machine, and what a product that cost nothing would reach.
fn budget(split: &Split, cores: f64) -> String {
    // All of the machine's time per turn at the target, in ms.
    let whole = cores * 1000.0 / TARGET_TURNS_PER_SEC;
    let head = format!(
        "budget: at the target, {whole:.3} ms of CPU per turn in all; RabbitMQ and Redis took {:.3} ms",
        split.services
    );
    if split.mixed > 0.0 {
        // One process holds the product and the harness: only the services are apart.
        return format!(
            "{head}, which leaves {:.3} ms to this process (front door, worker, fake model and clients), which took {:.3} ms",
            whole - split.services,
            split.mixed
        );
    }
    let outside = split.services + split.harness;
    let ceiling = cores * 1000.0 / outside.max(f64::EPSILON);
    let left = whole - outside;
    let against = if left <= 0.0 {
        "nothing is left for the product: the target is out of reach on this machine whatever the product does".to_string()
    } else if left >= split.product {
        format!(
            "{left:.3} ms is left for the product (serve + worker), which took {:.3} ms: it fits",
            split.product
        )
    } else {
        format!(
            "{left:.3} ms is left for the product (serve + worker), which took {:.3} ms: {:.0} % less would meet it",
            split.product,
            ((1.0 - left / split.product.max(f64::EPSILON)) * 100.0).max(0.0)
        )
    };
    format!(
        "{head} and the harness (fake model, clients) {:.3} ms, so {against}; a product that cost nothing could reach at most {ceiling:.0} turns/s here",
        split.harness
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rate: f64, clients: usize, model_ms: u64, p50_ms: u64, cpu: f64) -> Measured {
        Measured {
            split: Split {
                product: cpu * 0.5,
                services: cpu * 0.3,
                harness: cpu * 0.2,
                mixed: 0.0,
            },
            rate,
            clients,
            model: Duration::from_millis(model_ms),
            p50: Duration::from_millis(p50_ms),
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
    fn a_cpu_bound_run_says_what_the_target_leaves_the_product() {
        // 1.0 ms per turn: product 0.5, services 0.3, harness 0.2. At 2,000 turns/s two
        // cores give 1.0 ms per turn; 0.5 is left for the product, which took 0.5: it fits.
        let v = verdict(&run(1990.0, 1000, 200, 400, 1.0));
        assert!(v[3].starts_with("budget: at the target, 1.000 ms"), "{v:?}");
        assert!(v[3].contains("0.500 ms is left for the product"), "{v:?}");
        assert!(v[3].contains("which took 0.500 ms: it fits"), "{v:?}");
        assert!(v[3].contains("could reach at most 4000 turns/s"), "{v:?}");
        // 1.6 ms per turn: services 0.48 and harness 0.32 leave 0.2 of the product's 0.8.
        let v = verdict(&run(1200.0, 1000, 200, 600, 1.6));
        assert!(v[3].contains("0.200 ms is left for the product"), "{v:?}");
        assert!(v[3].contains("which took 0.800 ms: 75 % less"), "{v:?}");
        assert!(v[3].contains("could reach at most 2500 turns/s"), "{v:?}");
    }

    #[test]
    fn services_and_harness_that_fill_the_machine_leave_the_product_nothing() {
        let v = verdict(&run(900.0, 1000, 200, 900, 2.2));
        assert!(
            v[3].contains("nothing is left for the product: the target is out of reach"),
            "{v:?}"
        );
        // 2.2 ms: services 0.66 + harness 0.44 = 1.1 ms outside the product.
        assert!(v[3].contains("could reach at most 1818 turns/s"), "{v:?}");
    }

    #[test]
    fn one_process_runs_leave_the_budget_to_the_process_as_a_whole() {
        let mut m = run(1300.0, 500, 0, 380, 1.5);
        m.split = Split {
            services: 0.55,
            mixed: 0.95,
            ..Split::default()
        };
        let v = verdict(&m);
        assert!(
            v[3].contains(
                "RabbitMQ and Redis took 0.550 ms, which leaves 0.450 ms to this process"
            ),
            "{v:?}"
        );
        assert!(v[3].contains("which took 0.950 ms"), "{v:?}");
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
