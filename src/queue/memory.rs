//! The embedded in-memory broker: the same ack / requeue / delay / dead-letter semantics as the
//! RabbitMQ one, for single-process runs. Nothing survives the process (by design: the embedded
//! mode has no durability to offer).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};

use super::{Acker, Deliveries, Delivery, JobMeta, JobQueue, QueueError};
use super::{Replies, ReplyBus, SessionEvent, SessionEvents};
use crate::contract::SessionId;

/// A waiting job.
struct Job {
    body: Vec<u8>,
    meta: JobMeta,
    redelivered: bool,
}

/// An event subscriber: of results only, or of results and live events.
enum Listener {
    Status(mpsc::Sender<Vec<u8>>),
    All(mpsc::Sender<SessionEvent>),
}

/// The shared job queue is lane `None`; a tenant's lane is `Some(tenant)`.
type Lane = Option<String>;

#[derive(Default)]
struct State {
    ready: HashMap<Lane, VecDeque<Job>>,
    dead: VecDeque<(Vec<u8>, String)>,
    replies: HashMap<SessionId, VecDeque<Vec<u8>>>,
    subscribers: HashMap<SessionId, mpsc::Sender<Vec<u8>>>,
    listeners: HashMap<SessionId, Vec<Listener>>,
    /// One wake-up per lane, so a job wakes a consumer of its own lane.
    notify: HashMap<Lane, Arc<Notify>>,
}

impl State {
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
    /// An empty broker.
    pub fn new() -> Self {
        Self::default()
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
            .map(|s| {
                s.ready
                    .get(&tenant.map(str::to_string))
                    .map_or(0, VecDeque::len)
            })
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
                    .from_lane(lane.clone());
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
            if let Err(e) = self.broker.push(self.lane.take(), job) {
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
        self.push(lane.map(str::to_string), job)
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
            if let Err(e) = broker.push(None, job) {
                tracing::error!(error = %e, "in-memory broker lost a delayed retry");
            }
        });
        Ok(())
    }

    async fn publish_dead(
        &self,
        body: &[u8],
        _attempt: u32,
        reason: &str,
    ) -> Result<(), QueueError> {
        self.lock()?
            .dead
            .push_back((body.to_vec(), reason.to_string()));
        Ok(())
    }

    async fn consume(&self, prefetch: u16) -> Result<Deliveries, QueueError> {
        self.start_consumer(None, prefetch)
    }

    async fn consume_lane(&self, tenant: &str, prefetch: u16) -> Result<Deliveries, QueueError> {
        self.start_consumer(Some(tenant.to_string()), prefetch)
    }

    async fn check(&self) -> Result<(), QueueError> {
        self.lock().map(|_| ())
    }

    async fn drain_dead(&self, max: usize) -> Result<Vec<(Vec<u8>, String)>, QueueError> {
        let mut state = self.lock()?;
        let n = max.min(state.dead.len());
        Ok(state.dead.drain(..n).collect())
    }
}

#[async_trait::async_trait]
impl ReplyBus for MemoryBroker {
    async fn publish_reply(
        &self,
        session: &SessionId,
        _correlation_id: &str,
        body: &[u8],
    ) -> Result<(), QueueError> {
        let mut state = self.lock()?;
        if let Some(listeners) = state.listeners.get_mut(session) {
            // Closed or hopelessly slow listeners are dropped; the rest get every result.
            listeners.retain(|l| match l {
                Listener::Status(tx) => tx.try_send(body.to_vec()).is_ok(),
                Listener::All(tx) => tx.try_send(SessionEvent::Status(body.to_vec())).is_ok(),
            });
        }
        if let Some(tx) = state.subscribers.get(session) {
            if tx.try_send(body.to_vec()).is_ok() {
                return Ok(());
            }
            state.subscribers.remove(session);
        }
        state
            .replies
            .entry(session.clone())
            .or_default()
            .push_back(body.to_vec());
        Ok(())
    }
    async fn subscribe_replies(&self, session: &SessionId) -> Result<Replies, QueueError> {
        let (tx, rx) = mpsc::channel(1024);
        let mut state = self.lock()?;
        for body in state.replies.remove(session).unwrap_or_default() {
            let _ = tx.try_send(body);
        }
        state.subscribers.insert(session.clone(), tx);
        Ok(rx)
    }
    async fn subscribe_events(&self, session: &SessionId) -> Result<Replies, QueueError> {
        let (tx, rx) = mpsc::channel(1024);
        self.lock()?
            .listeners
            .entry(session.clone())
            .or_default()
            .push(Listener::Status(tx));
        Ok(rx)
    }
    async fn publish_live(&self, session: &SessionId, body: &[u8]) -> Result<(), QueueError> {
        let mut state = self.lock()?;
        if let Some(listeners) = state.listeners.get_mut(session) {
            // A full listener misses this event; a closed one is dropped.
            listeners.retain(|l| match l {
                Listener::Status(tx) => !tx.is_closed(),
                Listener::All(tx) => {
                    let _ = tx.try_send(SessionEvent::Live(body.to_vec()));
                    !tx.is_closed()
                }
            });
        }
        Ok(())
    }
    async fn subscribe_live(&self, session: &SessionId) -> Result<SessionEvents, QueueError> {
        let (tx, rx) = mpsc::channel(1024);
        self.lock()?
            .listeners
            .entry(session.clone())
            .or_default()
            .push(Listener::All(tx));
        Ok(rx)
    }
}
