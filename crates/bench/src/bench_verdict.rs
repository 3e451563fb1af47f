//! The closed loop's verdict: the share of the free-product ceiling — the turns per second a
//! product that cost nothing would reach on this machine, once RabbitMQ, Redis and the harness
//! (fake model, clients) have had the CPU they take per turn — and what bounds the figure: the
//! clients' own ceiling, the CPU, or the time a turn waits outside the model. The share is what
//! holds from host to host (an absolute turns-per-second target does not: the services and the
//! harness take most of two shared cores). Pure arithmetic on what the run measured, so it is
//! tested here with made-up runs; no measured figure is asserted anywhere.

use std::time::Duration;

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
    let mut lines = Vec::with_capacity(3);
    let cores = m.cores.max(1) as f64;
    let split = &m.split;
    // The free-product ceiling: the machine's CPU time per second over what everything but
    // the product takes per turn.
    let ceiling = (split.mixed == 0.0)
        .then(|| cores * 1000.0 / (split.services + split.harness).max(f64::EPSILON));
    lines.push(match ceiling {
        Some(ceiling) => format!(
            "free-product ceiling: {:.0} turns/s is {:.0} % of the {ceiling:.0} turns/s a product that cost nothing could reach here (RabbitMQ + Redis {:.3} ms and the harness {:.3} ms of CPU per turn, {cores:.0} cores; the product took {:.3} ms)",
            m.rate,
            m.rate / ceiling * 100.0,
            split.services,
            split.harness,
            split.product
        ),
        None => format!(
            "free-product ceiling: not told apart in one process (front door, worker, fake model and clients took {:.3} ms of CPU per turn, RabbitMQ + Redis {:.3} ms); run with --processes",
            split.mixed, split.services
        ),
    });
    let cpu_ms_per_turn = split.total();
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
    let loop_ceiling = (model_s > 0.0).then(|| clients / model_s);
    match (loop_ceiling, ceiling) {
        (Some(most), Some(ceiling)) if most < ceiling => lines.push(format!(
            "bound by the clients: {} clients waiting {} ms per turn for the model reach at most {most:.0} turns/s, below the ceiling; {:.0} would reach it",
            m.clients,
            m.model.as_millis(),
            (ceiling * model_s).ceil()
        )),
        _ if busy / cores >= BUSY => lines.push(format!(
            "bound by CPU: the product's {:.3} ms of the {cpu_ms_per_turn:.3} ms per turn ({:.0} %) is what the product's own code can move; a turn waits {path_ms:.0} ms (p50) outside the model, most of it for a core",
            split.product + split.mixed,
            (split.product + split.mixed) / cpu_ms_per_turn.max(f64::EPSILON) * 100.0
        )),
        _ => lines.push(format!(
            "bound by waiting, not CPU: a turn spends {path_ms:.0} ms (p50) outside the model in exchanges between processes; fewer exchanges in a row, not less CPU, raise this figure"
        )),
    }
    lines
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
    fn the_share_is_of_what_a_product_that_cost_nothing_could_reach() {
        // 1.0 ms per turn: services 0.3 and harness 0.2 leave two cores 4,000 turns/s.
        let v = verdict(&run(1990.0, 1000, 200, 400, 1.0));
        assert!(
            v[0].starts_with(
                "free-product ceiling: 1990 turns/s is 50 % of the 4000 turns/s a product that cost nothing could reach here"
            ),
            "{v:?}"
        );
        assert!(
            v[0].contains("RabbitMQ + Redis 0.300 ms and the harness 0.200 ms"),
            "{v:?}"
        );
        assert!(v[0].contains("the product took 0.500 ms"), "{v:?}");
        // 2.2 ms: services 0.66 + harness 0.44 = 1.1 ms outside the product.
        let v = verdict(&run(900.0, 1000, 200, 900, 2.2));
        assert!(v[0].contains("is 50 % of the 1818 turns/s"), "{v:?}");
    }

    #[test]
    fn one_process_runs_cannot_tell_the_product_apart() {
        let mut m = run(1300.0, 500, 0, 380, 1.5);
        m.split = Split {
            services: 0.55,
            mixed: 0.95,
            ..Split::default()
        };
        let v = verdict(&m);
        assert!(v[0].contains("not told apart in one process"), "{v:?}");
        assert!(
            v[0].contains("took 0.950 ms of CPU per turn, RabbitMQ + Redis 0.550 ms"),
            "{v:?}"
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
    fn a_full_machine_is_bound_by_cpu_and_says_the_products_share() {
        let v = verdict(&run(1550.0, 1000, 200, 314, 1.0));
        assert!(
            v[2].starts_with(
                "bound by CPU: the product's 0.500 ms of the 1.000 ms per turn (50 %)"
            ),
            "{v:?}"
        );
        assert!(v[2].contains("waits 114 ms (p50)"), "{v:?}");
    }

    #[test]
    fn an_idle_machine_is_bound_by_waiting() {
        let v = verdict(&run(800.0, 2000, 200, 600, 0.5));
        assert!(v[2].starts_with("bound by waiting"), "{v:?}");
        assert!(v[2].contains("400 ms (p50)"), "{v:?}");
    }

    #[test]
    fn too_few_clients_for_the_model_latency_is_said_first() {
        // 200 clients at 200 ms can never pass 1,000 turns/s, below the 4,000 ceiling.
        let v = verdict(&run(900.0, 200, 200, 222, 1.0));
        assert!(v[2].starts_with("bound by the clients: "), "{v:?}");
        assert!(v[2].contains("at most 1000 turns/s"), "{v:?}");
        assert!(v[2].contains("800 would reach it"), "{v:?}");
    }
}
