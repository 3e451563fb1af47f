//! The queues' names and settings: the topology every broker declares under a namespace, and
//! which front doors get a reply queue of their own.

use std::time::Duration;

use crate::contract::SessionId;

/// Which sessions have a durable reply queue (`APTIX_REPLY_QUEUES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyQueues {
    /// Every session: the worker declares a session's queue with its first status, so a
    /// client that comes later finds every status there. Costs the broker one queue declaration
    /// per new session (the dearest thing a new session costs it).
    EverySession,
    /// The default: sessions with a turn submitted to be read later
    /// ([`crate::queue::JobMeta::reply_queue_wanted`]: `POST /v1/turns`, `aptix turns submit`) get their
    /// queue as with [`ReplyQueues::EverySession`]; a synchronous call's or a batch line's
    /// status goes to the queue only when a client subscribed (as with
    /// [`ReplyQueues::OnSubscribe`]): nobody reads those from a reply queue, and a new
    /// session per document is the batch shape, where declarations would bound throughput.
    AsyncTurns,
    /// Sessions a client subscribed to: the queue is declared by the subscriber
    /// ([`crate::queue::ReplyBus::subscribe_replies`]) and gets the statuses published from then on; the
    /// worker publishes a session's status to its queue only when it exists and never declares
    /// one. Statuses from before the subscription are read from the store (HTTP).
    OnSubscribe,
}

impl ReplyQueues {
    /// Whether the worker declares the session's reply queue for a status of a job whose
    /// submitter does (`true`) or does not want one ([`crate::queue::JobMeta::reply_queue_wanted`]).
    pub fn declared_for(self, reply_queue_wanted: bool) -> bool {
        match self {
            Self::EverySession => true,
            Self::AsyncTurns => reply_queue_wanted,
            Self::OnSubscribe => false,
        }
    }

    /// The setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EverySession => "every-session",
            Self::AsyncTurns => "async-turns",
            Self::OnSubscribe => "on-subscribe",
        }
    }
}

impl std::str::FromStr for ReplyQueues {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "every-session" => Ok(Self::EverySession),
            "async-turns" => Ok(Self::AsyncTurns),
            "on-subscribe" => Ok(Self::OnSubscribe),
            other => Err(format!(
                "{other:?} is not one of async-turns, every-session, on-subscribe"
            )),
        }
    }
}

/// Names of everything the product declares, all under the namespace.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Prefix of every name.
    pub namespace: String,
    /// Delays of the retry queues, shortest first; a job's n-th retry uses the n-th (the last
    /// one repeats).
    pub retry_delays: Vec<Duration>,
    /// How long an unused reply queue lives.
    pub reply_queue_ttl: Duration,
    /// The most statuses a reply queue holds; the oldest are dropped beyond it.
    pub reply_queue_max_length: u32,
    /// Which sessions have a reply queue.
    pub reply_queues: ReplyQueues,
    /// Tenants with a lane of their own (those with `maxRunningTurns`).
    pub lanes: Vec<String>,
    /// Delays of the webhook retry queues, shortest first (see [`crate::queue::HookQueue`]).
    pub hook_delays: Vec<Duration>,
}

impl Topology {
    /// The defaults under a namespace.
    pub fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            retry_delays: [1, 5, 15, 60, 300].map(Duration::from_secs).to_vec(),
            reply_queue_ttl: Duration::from_secs(3600),
            reply_queue_max_length: 1000,
            reply_queues: ReplyQueues::AsyncTurns,
            lanes: Vec::new(),
            hook_delays: [5, 30, 120, 600, 3600].map(Duration::from_secs).to_vec(),
        }
    }
    /// The same topology with a lane for each of `tenants`.
    pub fn with_lanes<'a>(mut self, tenants: impl IntoIterator<Item = &'a str>) -> Self {
        self.lanes = tenants.into_iter().map(str::to_string).collect();
        self
    }
    /// A tenant's lane: the job queue of a tenant whose running turns are capped.
    pub fn lane(&self, tenant: &str) -> String {
        format!("{}.turns.tenant.{tenant}", self.namespace)
    }
    /// The turn job queue.
    pub fn jobs(&self) -> String {
        format!("{}.turns", self.namespace)
    }
    /// The dead-letter queue.
    pub fn dead(&self) -> String {
        format!("{}.turns.dead", self.namespace)
    }
    /// The retry queue for one delay.
    pub fn retry(&self, delay: Duration) -> String {
        format!("{}.turns.retry.{}ms", self.namespace, delay.as_millis())
    }
    /// The exchange of session events (keyed by session): statuses and live events broadcast
    /// to the front doors that watch a session, one binding per front door and session.
    pub fn events(&self) -> String {
        format!("{}.events", self.namespace)
    }
    /// A session's reply queue.
    pub fn reply_queue(&self, session: &SessionId) -> String {
        format!("{}.reply.{session}", self.namespace)
    }
    /// The queue of webhook deliveries waiting to be sent.
    pub fn hooks(&self) -> String {
        format!("{}.webhooks", self.namespace)
    }
    /// The webhook retry queue for one delay.
    pub fn hook_retry(&self, delay: Duration) -> String {
        format!("{}.webhooks.retry.{}ms", self.namespace, delay.as_millis())
    }
    /// The webhook deliveries that never succeeded.
    pub fn hooks_dead(&self) -> String {
        format!("{}.webhooks.dead", self.namespace)
    }
    /// The delay for a job's `retry`-th retry (1-based).
    pub fn delay_for(&self, retry: u32) -> Duration {
        let i = (retry.max(1) as usize - 1).min(self.retry_delays.len().saturating_sub(1));
        self.retry_delays
            .get(i)
            .copied()
            .unwrap_or(Duration::from_secs(1))
    }
}
