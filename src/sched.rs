//! The CPU scheduling class of the long-running processes (`aptix serve`, `aptix worker`,
//! `aptix run`), from `APTIX_CPU_SCHEDULING`: `normal` (the default) or `batch`.
//!
//! Why `batch` helps a turn's path: each process hands every RabbitMQ frame between its runtime
//! thread and lapin's I/O thread, and hands turns to Redis, RabbitMQ and the model server. With
//! the normal class, a thread that wakes another is often preempted by it at once (the woken
//! thread slept, so the kernel favours it), and pays a context switch for each hand-over. A
//! `SCHED_BATCH` thread does not preempt a running one when it wakes; it runs when that one
//! waits or its slice ends, so each wake-up carries more work. That is the trade a queue
//! worker wants where processes share cores; it is the kernel's `SCHED_BATCH`, what systemd
//! calls `CPUSchedulingPolicy=batch`, and needs no privilege. Measured in docs/benchmarks-journal.md
//! (round eleven).
//!
//! Owns: reading the setting and applying it. Must not: be applied once threads are running
//! (only threads started afterwards inherit the class).

/// The environment variable.
pub const VAR: &str = "APTIX_CPU_SCHEDULING";

/// A process's CPU scheduling class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuScheduling {
    /// The kernel's default (`SCHED_OTHER`).
    #[default]
    Normal,
    /// `SCHED_BATCH`: no preemption of running threads on wake-up.
    Batch,
}

/// The setting cannot be read or applied.
#[derive(Debug, thiserror::Error)]
pub enum SchedulingError {
    /// Not a class this setting knows.
    #[error("{VAR}={0:?} is not a scheduling class: use `normal` or `batch`")]
    Unknown(String),
    /// The kernel refused the class.
    #[error("cannot apply {VAR}=batch")]
    Refused(#[source] std::io::Error),
    /// Not available on this operating system.
    #[error("{VAR}=batch needs Linux")]
    Unsupported,
}

impl CpuScheduling {
    /// Reads the setting's value (unset or empty: [`CpuScheduling::Normal`]).
    pub fn parse(value: Option<&str>) -> Result<Self, SchedulingError> {
        match value.map(str::trim).unwrap_or_default() {
            "" => Ok(Self::Normal),
            v if v.eq_ignore_ascii_case("normal") => Ok(Self::Normal),
            v if v.eq_ignore_ascii_case("batch") => Ok(Self::Batch),
            v => Err(SchedulingError::Unknown(v.to_string())),
        }
    }

    /// Puts the calling thread in this class; the threads it starts afterwards inherit it, so
    /// call this before the async runtime (or anything else) starts threads. `Normal` changes
    /// nothing.
    pub fn apply(self) -> Result<(), SchedulingError> {
        match self {
            Self::Normal => Ok(()),
            Self::Batch => set_batch(),
        }
    }
}

#[cfg(target_os = "linux")]
fn set_batch() -> Result<(), SchedulingError> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid, initialised sched_param that outlives the call; pid 0 names
    // the calling thread; the call reads nothing else and keeps no pointer.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(SchedulingError::Refused(std::io::Error::last_os_error()))
    }
}

#[cfg(not(target_os = "linux"))]
fn set_batch() -> Result<(), SchedulingError> {
    Err(SchedulingError::Unsupported)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_is_normal_batch_or_a_clear_error() {
        assert_eq!(CpuScheduling::parse(None).ok(), Some(CpuScheduling::Normal));
        assert_eq!(
            CpuScheduling::parse(Some(" ")).ok(),
            Some(CpuScheduling::Normal)
        );
        assert_eq!(
            CpuScheduling::parse(Some("normal")).ok(),
            Some(CpuScheduling::Normal)
        );
        assert_eq!(
            CpuScheduling::parse(Some(" Batch ")).ok(),
            Some(CpuScheduling::Batch)
        );
        let err = CpuScheduling::parse(Some("fifo")).unwrap_err().to_string();
        assert!(err.contains(VAR) && err.contains("fifo"), "{err}");
    }

    /// On a thread of its own (the test harness's threads keep their class): the thread is
    /// in SCHED_BATCH afterwards, and so is a thread it starts.
    #[cfg(target_os = "linux")]
    #[test]
    fn batch_puts_the_thread_and_the_threads_it_starts_in_sched_batch() {
        let policy = || unsafe { libc::sched_getscheduler(0) };
        std::thread::spawn(move || {
            assert_eq!(policy(), libc::SCHED_OTHER);
            CpuScheduling::Normal.apply().unwrap();
            assert_eq!(policy(), libc::SCHED_OTHER, "normal changes nothing");
            CpuScheduling::Batch.apply().unwrap();
            assert_eq!(policy(), libc::SCHED_BATCH);
            let child = std::thread::spawn(policy).join().unwrap();
            assert_eq!(
                child,
                libc::SCHED_BATCH,
                "a thread started afterwards inherits it"
            );
        })
        .join()
        .unwrap();
    }
}
