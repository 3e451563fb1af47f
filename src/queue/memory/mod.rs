//! The embedded in-memory broker: the same ack / requeue / delay / dead-letter semantics as the
//! RabbitMQ one, for single-process runs. Nothing survives the process (by design: the embedded
//! mode has no durability to offer).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};

use super::{
    Acker, ChooseDead, DeadChoice, DeadLetter, Deliveries, Delivery, JobMeta, JobQueue, QueueDepth,
    QueueError,
};
use super::{Direct, Replies, ReplyBus, SessionEvent, SessionEvents};
use crate::contract::SessionId;

mod hooks;

/// A waiting job.
struct Job {
    body: Vec<u8>,
    meta: JobMeta,
    redelivered: bool,
}

impl Job {
    /// A job published now, without headers (a webhook delivery).
    fn fresh(body: &[u8]) -> Self {
        Self {
            body: body.to_vec(),
            meta: JobMeta::default(),
            redelivered: false,
        }
    }
}

/// An event subscriber: of statuses only, or of statuses and live events.
enum Listener {
    Results(mpsc::Sender<SessionEvent>),
    All(mpsc::Sender<SessionEvent>),
}

impl Listener {
    fn new(live: bool) -> (Self, SessionEvents) {
        let (tx, rx) = mpsc::channel(1024);
        (
            if live {
                Self::All(tx)
            } else {
                Self::Results(tx)
            },
            rx,
        )
    }

    fn is_closed(&self) -> bool {
        match self {
            Self::Results(tx) | Self::All(tx) => tx.is_closed(),
        }
    }
}

/// A session's reply queue: its statuses, and when it was last used (published to or
/// consumed), for the idle expiry.
#[derive(Default)]
struct ReplyQueue {
    bodies: VecDeque<Vec<u8>>,
    used: Option<Instant>,
}

/// Reply queue publishes between two sweeps of expired queues and forgotten subscribers.
const SWEEP_EVERY: u32 = 1024;

/// A queue of jobs: the shared job queue, a tenant's lane, or the webhook deliveries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Lane {
    Shared,
    Tenant(String),
    Hooks,
}

impl Lane {
    fn of(tenant: Option<&str>) -> Self {
        tenant.map_or(Self::Shared, |t| Self::Tenant(t.to_string()))
    }

    /// The tenant a delivery of this lane names (`None` for the others).
    fn tenant(&self) -> Option<String> {
        match self {
            Self::Tenant(t) => Some(t.clone()),
            Self::Shared | Self::Hooks => None,
        }
    }
}

#[derive(Default)]
struct State {
    ready: HashMap<Lane, VecDeque<Job>>,
    /// Dead-lettered jobs: body, reason, headers.
    dead: VecDeque<(Vec<u8>, String, JobMeta)>,
    /// Webhook deliveries that never succeeded, with the reason.
    dead_hooks: VecDeque<(Vec<u8>, String)>,
    replies: HashMap<SessionId, ReplyQueue>,
    /// Reply queues unused for this long are dropped, as RabbitMQ expires them.
    reply_ttl: Duration,
    /// The most statuses a reply queue holds (the oldest are dropped).
    reply_max_length: usize,
    /// Whether a session's queue exists before a client subscribes to it.
    reply_queues: Option<super::ReplyQueues>,
    publishes_since_sweep: u32,
    subscribers: HashMap<SessionId, mpsc::Sender<Vec<u8>>>,
    listeners: HashMap<SessionId, Vec<Listener>>,
    /// One wake-up per lane, so a job wakes a consumer of its own lane.
    notify: HashMap<Lane, Arc<Notify>>,
}

impl State {
    /// Drops expired reply queues, subscribers that are gone and empty subscriber lists, so
    /// nothing kept per session outlives its use.
    fn sweep(&mut self, now: Instant) {
        let ttl = self.reply_ttl;
        self.replies.retain(|_, q| {
            q.used
                .is_some_and(|at| now.saturating_duration_since(at) < ttl)
        });
        self.subscribers.retain(|_, tx| !tx.is_closed());
        self.listeners.retain(|_, list| {
            list.retain(|l| !l.is_closed());
            !list.is_empty()
        });
    }

    fn notify(&mut self, lane: &Lane) -> Arc<Notify> {
        self.notify.entry(lane.clone()).or_default().clone()
    }
}

/// Queues in process memory.
#[derive(Clone, Default)]
pub struct MemoryBroker {
    state: Arc<Mutex<State>>,
}

impl MemoryBroker {
    /// An empty broker with the default topology's reply queue limits.
    pub fn new() -> Self {
        Self::default().with_reply_queues(&super::Topology::new("memory"))
    }

    /// Reply queues as the topology says: which sessions have one, how long one lives unused
    /// and how many statuses it holds.
    pub fn with_reply_queues(self, topology: &super::Topology) -> Self {
        if let Ok(mut state) = self.state.lock() {
            state.reply_ttl = topology.reply_queue_ttl;
            state.reply_max_length = usize::try_from(topology.reply_queue_max_length)
                .unwrap_or(usize::MAX)
                .max(1);
            state.reply_queues = Some(topology.reply_queues);
        }
        self
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>, QueueError> {
        self.state
            .lock()
            .map_err(|_| QueueError::Unavailable("in-memory broker lock poisoned".into()))
    }

    fn push(&self, lane: Lane, job: Job) -> Result<(), QueueError> {
        let notify = {
            let mut state = self.lock()?;
            state.ready.entry(lane.clone()).or_default().push_back(job);
            state.notify(&lane)
        };
        notify.notify_one();
        Ok(())
    }

    /// Jobs waiting in the shared job queue (for tests and metrics).
    pub fn ready_len(&self) -> usize {
        self.lane_len(None)
    }

    /// Jobs waiting in a lane (`None`: the shared job queue).
    pub fn lane_len(&self, tenant: Option<&str>) -> usize {
        self.lock()
            .map(|s| s.ready.get(&Lane::of(tenant)).map_or(0, VecDeque::len))
            .unwrap_or(0)
    }

    fn start_consumer(&self, lane: Lane, prefetch: u16) -> Result<Deliveries, QueueError> {
        let notify = self.lock()?.notify(&lane);
        let (tx, rx) = mpsc::channel(usize::from(prefetch.max(1)));
        let permits = Arc::new(Semaphore::new(usize::from(prefetch.max(1))));
        let broker = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let job = loop {
                    let notified = notify.notified();
                    let next = broker
                        .lock()
                        .map(|mut s| s.ready.get_mut(&lane).and_then(VecDeque::pop_front));
                    match next {
                        Ok(Some(job)) => break job,
                        Ok(None) => notified.await,
                        Err(_) => return,
                    }
                };
                let acker = MemoryAcker {
                    broker: broker.clone(),
                    lane: lane.clone(),
                    pending: Some((job.body.clone(), job.meta.clone())),
                    _permit: permit,
                };
                let delivery = Delivery::new(job.body, 0, job.redelivered, Box::new(acker))
                    .with_meta(job.meta)
                    .from_lane(lane.tenant());
                if let Err(unsent) = tx.send(delivery).await {
                    // The consumer is gone: the job goes back, as an unacked delivery would.
                    let _ = unsent.0.requeue().await;
                    return;
                }
            }
        });
        Ok(rx)
    }
}

struct MemoryAcker {
    broker: MemoryBroker,
    lane: Lane,
    /// `Some` until the delivery is acked or requeued; a delivery dropped without either is
    /// requeued, as a broker does with the unacked deliveries of a closed channel.
    pending: Option<(Vec<u8>, JobMeta)>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for MemoryAcker {
    fn drop(&mut self) {
        if let Some((body, meta)) = self.pending.take() {
            let job = Job {
                body,
                meta,
                redelivered: true,
            };
            if let Err(e) = self.broker.push(self.lane.clone(), job) {
                tracing::error!(error = %e, "in-memory broker lost an unacknowledged delivery");
            }
        }
    }
}

#[async_trait::async_trait]
impl Acker for MemoryAcker {
    async fn ack(mut self: Box<Self>) -> Result<(), QueueError> {
        self.pending = None;
        Ok(())
    }
    async fn requeue(self: Box<Self>) -> Result<(), QueueError> {
        // Dropping a pending acker requeues it.
        drop(self);
        Ok(())
    }
}

#[async_trait::async_trait]
impl JobQueue for MemoryBroker {
    async fn enqueue(
        &self,
        lane: Option<&str>,
        body: &[u8],
        meta: &JobMeta,
    ) -> Result<(), QueueError> {
        let job = Job {
            body: body.to_vec(),
            meta: meta.clone(),
            redelivered: false,
        };
        self.push(Lane::of(lane), job)
    }

    async fn publish_retry(
        &self,
        body: &[u8],
        delay: Duration,
        meta: &JobMeta,
    ) -> Result<(), QueueError> {
        let broker = self.clone();
        let job = Job {
            body: body.to_vec(),
            meta: meta.clone(),
            redelivered: false,
        };
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Err(e) = broker.push(Lane::Shared, job) {
                tracing::error!(error = %e, "in-memory broker lost a delayed retry");
            }
        });
        Ok(())
    }

    async fn publish_dead(
        &self,
        body: &[u8],
        meta: &JobMeta,
        reason: &str,
    ) -> Result<(), QueueError> {
        self.lock()?
            .dead
            .push_back((body.to_vec(), reason.to_string(), meta.clone()));
        Ok(())
    }

    async fn consume(&self, prefetch: u16) -> Result<Deliveries, QueueError> {
        self.start_consumer(Lane::Shared, prefetch)
    }

    async fn consume_lane(&self, tenant: &str, prefetch: u16) -> Result<Deliveries, QueueError> {
        self.start_consumer(Lane::Tenant(tenant.to_string()), prefetch)
    }

    async fn check(&self) -> Result<(), QueueError> {
        self.lock().map(|_| ())
    }

    async fn drain_dead(&self, max: usize) -> Result<Vec<(Vec<u8>, String)>, QueueError> {
        let mut state = self.lock()?;
        let n = max.min(state.dead.len());
        Ok(state.dead.drain(..n).map(|d| (d.0, d.1)).collect())
    }

    async fn depths(&self) -> Result<Vec<QueueDepth>, QueueError> {
        let state = self.lock()?;
        let ready = |lane: &Lane| state.ready.get(lane).map_or(0, |q| q.len() as u64);
        let mut out = vec![QueueDepth {
            name: "jobs".into(),
            role: "jobs",
            messages: ready(&Lane::Shared),
            consumers: None,
        }];
        let mut lanes: Vec<&String> = state
            .ready
            .keys()
            .filter_map(|l| match l {
                Lane::Tenant(t) => Some(t),
                _ => None,
            })
            .collect();
        lanes.sort();
        for t in lanes {
            out.push(QueueDepth {
                name: format!("lane {t}"),
                role: "lane",
                messages: ready(&Lane::Tenant(t.clone())),
                consumers: None,
            });
        }
        out.push(QueueDepth {
            name: "dead".into(),
            role: "dead",
            messages: state.dead.len() as u64,
            consumers: None,
        });
        out.push(QueueDepth {
            name: "webhooks".into(),
            role: "webhooks",
            messages: ready(&Lane::Hooks),
            consumers: None,
        });
        Ok(out)
    }

    async fn sweep_dead(
        &self,
        max: usize,
        choose: &ChooseDead,
    ) -> Result<Vec<(DeadLetter, DeadChoice)>, QueueError> {
        let (swept, requeued) = {
            let mut state = self.lock()?;
            let n = max.min(state.dead.len());
            let mut swept = Vec::with_capacity(n);
            let mut requeued = Vec::new();
            for (body, reason, meta) in state.dead.drain(..n).collect::<Vec<_>>() {
                let letter = DeadLetter { body, reason, meta };
                let choice = choose(&letter);
                match choice {
                    DeadChoice::Keep => state.dead.push_back((
                        letter.body.clone(),
                        letter.reason.clone(),
                        letter.meta.clone(),
                    )),
                    DeadChoice::Requeue => requeued.push(Job {
                        body: letter.body.clone(),
                        meta: super::revived(&letter.meta),
                        redelivered: false,
                    }),
                    DeadChoice::Discard => {}
                }
                swept.push((letter, choice));
            }
            (swept, requeued)
        };
        for job in requeued {
            self.push(Lane::Shared, job)?;
        }
        Ok(swept)
    }
}

#[async_trait::async_trait]
impl ReplyBus for MemoryBroker {
    async fn publish_reply(
        &self,
        session: &SessionId,
        _correlation_id: &str,
        _reply_to: Option<&str>,
        // In one process a status sent to nobody costs nothing: every subscriber gets it.
        audience: super::Audience,
        body: &[u8],
    ) -> Result<(), QueueError> {
        let mut state = self.lock()?;
        let now = Instant::now();
        state.publishes_since_sweep += 1;
        if state.publishes_since_sweep >= SWEEP_EVERY {
            state.publishes_since_sweep = 0;
            state.sweep(now);
        }
        // Every listener of the process hears every session's results, so a direct address is
        // not needed here.
        if let Some(listeners) = state.listeners.get_mut(session) {
            // Closed or hopelessly slow listeners are dropped; the rest get every result.
            listeners.retain(|l| match l {
                Listener::Results(tx) | Listener::All(tx) => {
                    tx.try_send(SessionEvent::Status(body.to_vec())).is_ok()
                }
            });
            if listeners.is_empty() {
                state.listeners.remove(session);
            }
        }
        if let Some(tx) = state.subscribers.get(session) {
            if tx.try_send(body.to_vec()).is_ok() {
                return Ok(());
            }
            state.subscribers.remove(session);
        }
        let declared = state
            .reply_queues
            .is_none_or(|q| q.declared_for(audience.reply_queue_wanted));
        if !declared && !state.replies.contains_key(session) {
            return Ok(()); // nobody subscribed: the session has no queue
        }
        let max = state.reply_max_length;
        let queue = state.replies.entry(session.clone()).or_default();
        queue.used = Some(now);
        queue.bodies.push_back(body.to_vec());
        while queue.bodies.len() > max {
            queue.bodies.pop_front();
        }
        Ok(())
    }
    async fn subscribe_replies(&self, session: &SessionId) -> Result<Replies, QueueError> {
        let (tx, rx) = mpsc::channel(1024);
        let mut state = self.lock()?;
        // The queue is handed to the subscriber and stays, empty, for what comes later.
        let queue = state.replies.entry(session.clone()).or_default();
        queue.used = Some(Instant::now());
        for body in std::mem::take(&mut queue.bodies) {
            let _ = tx.try_send(body);
        }
        state.subscribers.insert(session.clone(), tx);
        Ok(rx)
    }
    async fn publish_live(
        &self,
        session: &SessionId,
        _reply_to: Option<&str>,
        body: &[u8],
    ) -> Result<(), QueueError> {
        let mut state = self.lock()?;
        if let Some(listeners) = state.listeners.get_mut(session) {
            // A full listener misses this event; a closed one is dropped.
            listeners.retain(|l| match l {
                Listener::All(tx) => {
                    let _ = tx.try_send(SessionEvent::Live(body.to_vec()));
                    !tx.is_closed()
                }
                other => !other.is_closed(),
            });
            if listeners.is_empty() {
                state.listeners.remove(session);
            }
        }
        Ok(())
    }
    async fn subscribe_session(
        &self,
        session: &SessionId,
        live: bool,
    ) -> Result<SessionEvents, QueueError> {
        let (listener, events) = Listener::new(live);
        self.listen(session, listener)?;
        Ok(events)
    }
    async fn subscribe_direct(
        &self,
        session: &SessionId,
        live: bool,
    ) -> Result<Direct, QueueError> {
        let (listener, events) = Listener::new(live);
        self.listen(session, listener)?;
        Ok(Direct {
            address: None,
            events,
        })
    }
    async fn direct_address(&self) -> Result<Option<String>, QueueError> {
        Ok(None)
    }
}

impl MemoryBroker {
    fn listen(&self, session: &SessionId, listener: Listener) -> Result<(), QueueError> {
        self.lock()?
            .listeners
            .entry(session.clone())
            .or_default()
            .push(listener);
        Ok(())
    }

    /// Sessions with something kept for them (reply queues, subscribers): what must not grow
    /// with the sessions served.
    pub fn sessions_held(&self) -> usize {
        self.lock().map_or(0, |s| {
            s.replies.len() + s.subscribers.len() + s.listeners.len()
        })
    }

    /// Sweeps now as if `elapsed` had passed (tests of the expiry).
    #[cfg(test)]
    fn sweep_after(&self, elapsed: Duration) {
        if let Ok(mut s) = self.lock() {
            s.sweep(Instant::now() + elapsed);
        }
    }
}

#[cfg(test)]
mod tests;
