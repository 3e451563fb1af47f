//! The embedded in-memory broker: the same ack / requeue / delay / dead-letter semantics as the
//! RabbitMQ one, for single-process runs. Nothing survives the process (by design: the embedded
//! mode has no durability to offer).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};

use super::{Acker, Deliveries, Delivery, JobQueue, QueueError};
use super::{Replies, ReplyBus};
use crate::contract::SessionId;

/// A waiting job: body, attempt, redelivered, traceparent.
type Job = (Vec<u8>, u32, bool, Option<String>);

#[derive(Default)]
struct State {
    ready: VecDeque<Job>,
    dead: VecDeque<(Vec<u8>, String)>,
    replies: HashMap<SessionId, VecDeque<Vec<u8>>>,
    subscribers: HashMap<SessionId, mpsc::Sender<Vec<u8>>>,
    listeners: HashMap<SessionId, Vec<mpsc::Sender<Vec<u8>>>>,
}

/// Queues in process memory.
#[derive(Clone, Default)]
pub struct MemoryBroker {
    state: Arc<Mutex<State>>,
    notify: Arc<Notify>,
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

    fn push(&self, job: Job) -> Result<(), QueueError> {
        self.lock()?.ready.push_back(job);
        self.notify.notify_one();
        Ok(())
    }

    /// Jobs waiting in the job queue (for tests and metrics).
    pub fn ready_len(&self) -> usize {
        self.lock().map(|s| s.ready.len()).unwrap_or(0)
    }
}

struct MemoryAcker {
    broker: MemoryBroker,
    /// `Some` until the delivery is acked or requeued; a delivery dropped without either is
    /// requeued, as a broker does with the unacked deliveries of a closed channel.
    pending: Option<(Vec<u8>, u32, Option<String>)>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for MemoryAcker {
    fn drop(&mut self) {
        if let Some((body, attempt, trace)) = self.pending.take()
            && let Err(e) = self.broker.push((body, attempt, true, trace))
        {
            tracing::error!(error = %e, "in-memory broker lost an unacknowledged delivery");
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
    async fn publish_traced_job(
        &self,
        body: &[u8],
        traceparent: Option<&str>,
    ) -> Result<(), QueueError> {
        self.push((body.to_vec(), 0, false, traceparent.map(str::to_string)))
    }

    async fn publish_retry(
        &self,
        body: &[u8],
        attempt: u32,
        delay: Duration,
        traceparent: Option<&str>,
    ) -> Result<(), QueueError> {
        let (broker, body) = (self.clone(), body.to_vec());
        let trace = traceparent.map(str::to_string);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Err(e) = broker.push((body, attempt, false, trace)) {
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
        let (tx, rx) = mpsc::channel(usize::from(prefetch.max(1)));
        let permits = Arc::new(Semaphore::new(usize::from(prefetch.max(1))));
        let broker = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let job = loop {
                    let notified = broker.notify.notified();
                    match broker.lock().map(|mut s| s.ready.pop_front()) {
                        Ok(Some(job)) => break job,
                        Ok(None) => notified.await,
                        Err(_) => return,
                    }
                };
                let (body, attempt, redelivered, trace) = job;
                let acker = MemoryAcker {
                    broker: broker.clone(),
                    pending: Some((body.clone(), attempt, trace.clone())),
                    _permit: permit,
                };
                let delivery = Delivery::new(body, attempt, redelivered, Box::new(acker))
                    .with_traceparent(trace);
                if let Err(unsent) = tx.send(delivery).await {
                    // The consumer is gone: the job goes back, as an unacked delivery would.
                    let _ = unsent.0.requeue().await;
                    return;
                }
            }
        });
        Ok(rx)
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
            // Closed or hopelessly slow listeners are dropped; the rest get every event.
            listeners.retain(|tx| tx.try_send(body.to_vec()).is_ok());
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
            .push(tx);
        Ok(rx)
    }
}
