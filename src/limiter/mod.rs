//! Limits on model calls per agent context, shared by every worker (AGN-003 §2: the agent
//! context is the model backend; its server's limits are the ones that matter).
//!
//! Two limits, both optional per context:
//! - `maxConcurrentCalls`: a semaphore of slots. A slot expires unless its holder renews it
//!   (every third of its time to live), so a worker that dies holding one frees it after at
//!   most one time to live.
//! - `requestsPerMinute`: calls are spaced at least `window / n` apart (GCRA with no burst),
//!   so no window holds more than `n` calls. A 429 from the model pushes the context's next
//!   call out by the server's `retry-after` (or a second), for every worker.
//!
//! A call waits for capacity up to a bound; past it the caller gets [`NoCapacity`] and the turn
//! goes back to the queue (the worker does not count that as a failed attempt).
//!
//! Owns: the waiting and the permits. The counting itself is a [`LimitStore`]: [`memory`]
//! (one process) or [`redis`] (every process sharing the Redis). Must not: call the model.

#[cfg(feature = "bench")]
pub mod bench;
pub mod memory;
pub mod redis;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::Metrics;

pub use memory::MemoryLimits;
pub use redis::RedisLimits;

/// The limit store cannot be reached; the call waits as if there were no capacity.
#[derive(Debug, thiserror::Error)]
#[error("the call limiter is unavailable: {0}")]
pub struct LimitStoreError(pub String);

/// Where slots and rate state are kept.
#[async_trait::async_trait]
pub trait LimitStore: Send + Sync + 'static {
    /// Takes a slot for `token` if fewer than `max` live slots exist; `true` when taken.
    async fn try_slot(
        &self,
        context: &str,
        token: &str,
        max: u32,
        ttl: Duration,
    ) -> Result<bool, LimitStoreError>;
    /// Extends `token`'s slot; `false` when it had expired (and may have been taken).
    async fn renew_slot(
        &self,
        context: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, LimitStoreError>;
    /// Gives a slot back.
    async fn release_slot(&self, context: &str, token: &str) -> Result<(), LimitStoreError>;
    /// Takes the context's next call time if it has come (`None`: go now, and the next call may
    /// go `interval` later), else says how long until it comes.
    async fn try_rate(
        &self,
        context: &str,
        interval: Duration,
    ) -> Result<Option<Duration>, LimitStoreError>;
    /// Makes the context's next call wait at least `pause` from now.
    async fn slow_down(&self, context: &str, pause: Duration) -> Result<(), LimitStoreError>;
    /// Live slots of the context (for tests and `aptix contexts`).
    async fn slots_in_use(&self, context: &str) -> Result<u32, LimitStoreError>;
    /// The key of `key`'s tally for `day` ([`LimitStore::add_tally`]), for a writer on the
    /// same server that adds to it in a step of its own (a run's write:
    /// [`crate::store::CounterAdds`]), keeping it as that does; `None` for a store without
    /// such keys.
    fn tally_key(&self, key: &str, day: &str) -> Option<String> {
        let _ = (key, day);
        None
    }
    /// The count of tokens (or cost) `key` had for `day` in a key of its own, as versions
    /// before 2026-12-05 kept beside the tally (0 when there is none): read with the tally so
    /// that the day of an upgrade from a version that kept no tally still counts whole. Only
    /// a store that outlives the process has one.
    async fn earlier_count(&self, key: &str, day: &str) -> Result<u64, LimitStoreError> {
        let _ = (key, day);
        Ok(0)
    }
    /// Adds each `(field, amount)` of `counts` to `key`'s tally for `day`, in one step; a
    /// tally is kept at least `keep` after the change that made it.
    async fn add_tally(
        &self,
        key: &str,
        day: &str,
        counts: &[(String, u64)],
        keep: Duration,
    ) -> Result<(), LimitStoreError>;
    /// `key`'s tally for `day`, by field (empty when nothing was counted).
    async fn tally(
        &self,
        key: &str,
        day: &str,
    ) -> Result<std::collections::BTreeMap<String, u64>, LimitStoreError>;
}

/// One context's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// At most this many calls at once.
    pub max_concurrent: Option<u32>,
    /// At most this many calls per `window`.
    pub per_window: Option<u32>,
    /// The window `per_window` counts in (a minute in production).
    pub window: Duration,
    /// How long a call waits for capacity before [`NoCapacity`].
    pub wait: Duration,
    /// A slot's time to live without renewal.
    pub slot_ttl: Duration,
}

/// No capacity came free within the wait bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("agent context {context:?} had no capacity for a model call within {} ms ({why})", waited.as_millis())]
pub struct NoCapacity {
    /// The context.
    pub context: String,
    /// How long the call waited.
    pub waited: Duration,
    /// Which limit held it back.
    pub why: &'static str,
}

/// The limiter of one agent context.
#[derive(Clone)]
pub struct CallLimiter {
    store: Arc<dyn LimitStore>,
    context: String,
    limits: CallLimits,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for CallLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallLimiter")
            .field("context", &self.context)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// How often a waiting call asks again for a slot.
const SLOT_POLL: Duration = Duration::from_millis(20);

impl CallLimiter {
    /// A limiter for `context` over `store`.
    pub fn new(
        store: Arc<dyn LimitStore>,
        context: &str,
        limits: CallLimits,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            store,
            context: context.to_string(),
            limits,
            metrics,
        }
    }

    /// The limits it holds calls to.
    pub fn limits(&self) -> CallLimits {
        self.limits
    }

    /// The context this limiter guards.
    pub fn context(&self) -> &str {
        &self.context
    }

    /// Waits for a slot (if the context caps concurrency), then for the rate (if it caps
    /// that); the permit holds the slot until dropped or released.
    pub async fn acquire(&self) -> Result<CallPermit, NoCapacity> {
        let started = Instant::now();
        let deadline = started + self.limits.wait;
        let mut waited = false;
        let token = uuid::Uuid::new_v4().simple().to_string();
        let slot = match self.limits.max_concurrent {
            None => None,
            Some(max) => {
                loop {
                    match self
                        .store
                        .try_slot(&self.context, &token, max, self.limits.slot_ttl)
                        .await
                    {
                        Ok(true) => break,
                        Ok(false) => {}
                        Err(e) => {
                            tracing::warn!(context = %self.context, error = %e, "cannot take a call slot; waiting");
                        }
                    }
                    waited = true;
                    if Instant::now() + SLOT_POLL > deadline {
                        return Err(self.no_capacity(started, "maxConcurrentCalls"));
                    }
                    tokio::time::sleep(jittered(SLOT_POLL)).await;
                }
                Some(self.hold(token))
            }
        };
        let interval = self
            .limits
            .per_window
            .map_or(Duration::ZERO, |n| self.limits.window / n.max(1));
        loop {
            let wait = match self.store.try_rate(&self.context, interval).await {
                Ok(None) => break,
                Ok(Some(wait)) => wait,
                Err(e) => {
                    tracing::warn!(context = %self.context, error = %e, "cannot read the call rate; waiting");
                    SLOT_POLL
                }
            };
            waited = true;
            if Instant::now() + wait > deadline {
                drop(slot);
                return Err(self.no_capacity(started, "requestsPerMinute"));
            }
            tokio::time::sleep(wait).await;
        }
        if waited {
            self.metrics
                .capacity_waited(&self.context, started.elapsed());
        }
        self.metrics.context_call_started(&self.context);
        Ok(CallPermit {
            _slot: slot,
            metrics: self.metrics.clone(),
            context: self.context.clone(),
            waited: if waited {
                started.elapsed()
            } else {
                Duration::ZERO
            },
        })
    }

    /// Tells every worker to hold this context's calls for `pause` (the model answered 429).
    pub async fn slow_down(&self, pause: Duration) {
        self.metrics.context_rate_limited(&self.context);
        if let Err(e) = self.store.slow_down(&self.context, pause).await {
            tracing::warn!(context = %self.context, error = %e, "cannot slow the context down");
        }
    }

    fn no_capacity(&self, started: Instant, why: &'static str) -> NoCapacity {
        let waited = started.elapsed();
        self.metrics.capacity_waited(&self.context, waited);
        NoCapacity {
            context: self.context.clone(),
            waited,
            why,
        }
    }

    /// A slot taken for `token`, renewed until released.
    fn hold(&self, token: String) -> HeldSlot {
        HeldSlot::renewed(&self.store, &self.context, token, self.limits.slot_ttl)
    }
}

/// Up to a quarter more, so waiting workers do not ask in lockstep.
fn jittered(d: Duration) -> Duration {
    d + d.mul_f64(fastrand::f64() / 4.0)
}

/// A slot of a [`LimitStore`] set, renewed every third of its time to live while held and
/// given back when dropped.
pub(crate) struct HeldSlot {
    store: Arc<dyn LimitStore>,
    context: String,
    token: String,
    renewer: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for HeldSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldSlot")
            .field("set", &self.context)
            .finish_non_exhaustive()
    }
}

impl HeldSlot {
    /// Holds the slot `token` took in `context`'s set.
    pub(crate) fn renewed(
        store: &Arc<dyn LimitStore>,
        context: &str,
        token: String,
        ttl: Duration,
    ) -> Self {
        let (renew_store, renew_context, renew_token) =
            (store.clone(), context.to_string(), token.clone());
        let renewer = tokio::spawn(async move {
            let context = renew_context;
            loop {
                tokio::time::sleep(ttl / 3).await;
                match renew_store.renew_slot(&context, &renew_token, ttl).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(%context, "a slot expired while held; its set may briefly run one over its limit");
                        return;
                    }
                    Err(e) => tracing::warn!(%context, error = %e, "cannot renew a slot"),
                }
            }
        });
        Self {
            store: store.clone(),
            context: context.to_string(),
            token,
            renewer,
        }
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        self.renewer.abort();
        // Given back in the background; if that fails the slot expires on its own.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (store, context, token) = (
                self.store.clone(),
                std::mem::take(&mut self.context),
                std::mem::take(&mut self.token),
            );
            rt.spawn(async move {
                if let Err(e) = store.release_slot(&context, &token).await {
                    tracing::warn!(%context, error = %e, "cannot give a slot back; it expires on its own");
                }
            });
        }
    }
}

/// Permission for one model call; dropping it gives its slot back.
pub struct CallPermit {
    _slot: Option<HeldSlot>,
    metrics: Arc<Metrics>,
    context: String,
    waited: Duration,
}

impl CallPermit {
    /// How long the call waited for it (zero when a slot and the rate were free at once).
    pub fn waited(&self) -> Duration {
        self.waited
    }
}

impl std::fmt::Debug for CallPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallPermit")
            .field("context", &self.context)
            .field("slot", &self._slot.is_some())
            .finish()
    }
}

impl Drop for CallPermit {
    fn drop(&mut self) {
        self.metrics.context_call_finished(&self.context);
    }
}
