//! `[worker]`: how many turns a worker runs, how long they may take, and its process.

use std::time::Duration;

use super::ConfigError;
use super::setting::{Alias, Default, Kind, Reader, Setting, Unit};
use crate::sched::CpuScheduling;
use crate::sizing::default_concurrency;

/// `APTIX_CONCURRENCY`.
pub static CONCURRENCY: Setting = Setting {
    var: "APTIX_CONCURRENCY",
    key: "worker.concurrency",
    aliases: &[],
    kind: Kind::Number,
    default: Default::Computed(
        "a quarter of the memory the process may use (its cgroup's limit, else the machine's) at \
         32 KiB per turn, between 64 and 8192",
    ),
    about: "turns one worker runs at once. A turn mostly waits on the model, so this bounds a \
            worker's memory, not its CPU; each agent context's own limits protect the model server",
};

/// `APTIX_MAX_ITERATIONS`.
pub static MAX_ITERATIONS: Setting = Setting {
    var: "APTIX_MAX_ITERATIONS",
    key: "worker.max_iterations",
    aliases: &[],
    kind: Kind::Number,
    default: Default::Value("8"),
    about: "model calls one turn may make before it fails with `ITERATION_LIMIT`",
};

/// `APTIX_TURN_DEADLINE`.
pub static TURN_DEADLINE: Setting = Setting {
    var: "APTIX_TURN_DEADLINE",
    key: "worker.turn_deadline",
    aliases: &[Alias {
        var: "APTIX_TURN_DEADLINE_SECS",
        unit: Some(Unit::Seconds),
    }],
    kind: Kind::Duration,
    default: Default::Value("10m"),
    about: "the longest one run of a turn may take (keep it well below RabbitMQ's \
            `consumer_timeout`)",
};

/// `APTIX_SHUTDOWN_GRACE`.
pub static SHUTDOWN_GRACE: Setting = Setting {
    var: "APTIX_SHUTDOWN_GRACE",
    key: "worker.shutdown_grace",
    aliases: &[Alias {
        var: "APTIX_SHUTDOWN_GRACE_SECS",
        unit: Some(Unit::Seconds),
    }],
    kind: Kind::Duration,
    default: Default::Value("30s"),
    about: "how long a stopping worker waits for its turns in flight",
};

/// `APTIX_LANE_WAIT`.
pub static LANE_WAIT: Setting = Setting {
    var: "APTIX_LANE_WAIT",
    key: "worker.lane_wait",
    aliases: &[Alias {
        var: "APTIX_LANE_WAIT_MS",
        unit: Some(Unit::Millis),
    }],
    kind: Kind::Duration,
    default: Default::Value("1m"),
    about: "how long a worker holds a capped tenant's job waiting for one of the tenant's running \
            slots before giving it back to the tenant's lane",
};

/// `APTIX_MODES_FILE`.
pub static MODES_FILE: Setting = Setting {
    var: "APTIX_MODES_FILE",
    key: "worker.modes_file",
    aliases: &[],
    kind: Kind::Path,
    default: Default::Unset,
    about: "a mode catalog (JSON, the format `aptix modes` prints) replacing the built-in one",
};

/// `APTIX_CPU_SCHEDULING`.
pub static CPU_SCHEDULING: Setting = Setting {
    var: crate::sched::VAR,
    key: "worker.cpu_scheduling",
    aliases: &[],
    kind: Kind::Choice(&["normal", "batch"]),
    default: Default::Value("normal"),
    about: "`batch` runs `serve`, `worker` and `run` in the kernel's `SCHED_BATCH` class (Linux, no \
            privilege needed): a thread that wakes another is not preempted by it at once, so each \
            wake-up carries more work (measured in docs/benchmarks-journal.md); an unknown value stops \
            those commands (exit 2), the others ignore it",
};

/// The settings of this section.
pub static SETTINGS: &[&Setting] = &[
    &CONCURRENCY,
    &MAX_ITERATIONS,
    &TURN_DEADLINE,
    &SHUTDOWN_GRACE,
    &LANE_WAIT,
    &MODES_FILE,
    &CPU_SCHEDULING,
];

/// `[worker]`.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Turns one worker runs at once.
    pub concurrency: usize,
    /// Model calls one turn may make.
    pub max_iterations: usize,
    /// The longest one run of a turn may take.
    pub turn_deadline: Duration,
    /// How long shutdown waits for in-flight turns.
    pub shutdown_grace: Duration,
    /// How long a worker holds a capped tenant's job waiting for a running slot.
    pub lane_wait: Duration,
    /// A mode catalog replacing the built-in one.
    pub modes_file: Option<String>,
    /// The long-running processes' CPU scheduling class (applied by the binary at start).
    pub cpu_scheduling: CpuScheduling,
}

impl Worker {
    /// Reads the section.
    pub fn read(r: &Reader) -> Result<Self, ConfigError> {
        let concurrency = match r.parse(&CONCURRENCY, |t, _| match t.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            Ok(_) => Err("must be greater than zero".to_string()),
            Err(e) => Err(format!("{t:?} is not a valid number ({e})")),
        })? {
            Some(n) => n,
            None => {
                let n = default_concurrency();
                r.show(&CONCURRENCY, n.to_string());
                n
            }
        };
        Ok(Self {
            concurrency,
            max_iterations: r.positive(&MAX_ITERATIONS)?,
            turn_deadline: r.positive_duration(&TURN_DEADLINE)?,
            shutdown_grace: r.duration(&SHUTDOWN_GRACE)?,
            lane_wait: r.positive_duration(&LANE_WAIT)?,
            modes_file: r.text(&MODES_FILE)?,
            // Checked strictly only where it applies (by the binary, for `serve`, `worker` and
            // `run`): the other commands start whatever it says.
            cpu_scheduling: r
                .parse(&CPU_SCHEDULING, |t, _| {
                    Ok(CpuScheduling::parse(Some(t)).unwrap_or_default())
                })?
                .unwrap_or_default(),
        })
    }
}

/// The CPU scheduling class, an unknown one refused (the binary reads it for the long-running
/// commands before the runtime starts its threads).
pub fn read_cpu_scheduling(r: &Reader) -> Result<CpuScheduling, ConfigError> {
    Ok(r.parse(&CPU_SCHEDULING, |t, _| {
        CpuScheduling::parse(Some(t)).map_err(|e| e.to_string())
    })?
    .unwrap_or_default())
}
