//! Sending webhook deliveries: consume the webhook queue, POST each delivery signed, with a
//! timeout; a 2xx answer is delivered (acked), anything else is tried again after the next
//! delay of the schedule (through the broker's delayed queues, as jobs are), until the give-up
//! age, then dead-lettered. A delivery is acked only once its outcome is confirmed by the
//! broker (delivered, retry enqueued, or dead-lettered): a sender killed mid-POST leaves it
//! unacked and it is sent again (at least once, the same `webhook-id`).
//!
//! It runs in the worker process, on its own consumer and concurrency (`APTIX_WEBHOOK_*`):
//! deliveries never take a turn's slot, and a fleet of workers is a fleet of senders without
//! another process to deploy.
//!
//! Owns: the delivery loop and what an attempt came to. Must not: build events.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument as _, debug, info, info_span, warn};

use super::HookJob;
use super::guard::{Guard, Refused};
use crate::metrics::Metrics;
use crate::queue::{Broker, Delivery};

/// What an attempt can come to, as `aptix_webhook_deliveries_total` labels it.
const OUTCOMES: [&str; 3] = ["delivered", "retried", "dead"];

/// How often a sender counts the deliveries waiting (`aptix_webhook_queue_depth`).
const COUNT_EVERY: Duration = Duration::from_secs(10);

/// How deliveries are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendSettings {
    /// The longest one POST may take.
    pub timeout: Duration,
    /// Deliveries in flight at once.
    pub concurrency: u16,
    /// The waits before the 1st, 2nd, … retry; the last repeats.
    pub delays: Vec<Duration>,
    /// A delivery still failing this long after its event is dead-lettered.
    pub give_up_after: Duration,
}

impl Default for SendSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            concurrency: 32,
            delays: [5, 30, 120, 600, 3600].map(Duration::from_secs).to_vec(),
            give_up_after: Duration::from_secs(24 * 3600),
        }
    }
}

impl SendSettings {
    /// The wait before retry number `retry` (1-based).
    pub fn delay_for(&self, retry: u32) -> Duration {
        let i = (retry.max(1) as usize - 1).min(self.delays.len().saturating_sub(1));
        self.delays
            .get(i)
            .copied()
            .unwrap_or(Duration::from_secs(5))
    }
}

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The receiver answered 2xx.
    Delivered,
    /// Anything else: a status, a timeout, a refused connection. Tried again.
    Failed(String),
    /// Never deliverable as it stands (a URL the policy refuses, a secret that is not set):
    /// dead-lettered at once, sent again by `aptix webhooks replay` once fixed.
    Refused(String),
}

/// Consumes the webhook queue and sends what it holds.
#[derive(Clone)]
pub struct Sender {
    broker: Arc<dyn Broker>,
    http: reqwest::Client,
    guard: Guard,
    settings: Arc<SendSettings>,
    secrets: Arc<super::sign::Secrets>,
    metrics: Arc<Metrics>,
    /// Told of each batch line's event once it is finished (see [`super::LineOf`]).
    lines: Option<Arc<dyn LineFinished>>,
}

/// Whoever counts a batch's lines towards its `batch.completed`: told when a line's event is
/// delivered or dead-lettered (the delivery is acked only once it knows).
#[async_trait::async_trait]
pub trait LineFinished: Send + Sync {
    /// The event of `line` to `url` is finished.
    async fn finished(&self, line: &super::LineOf, url: &str) -> Result<(), String>;
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Sender {
    /// A sender over `broker`'s webhook queue; URLs are held to `guard` (the HTTP client
    /// resolves names through it, and follows no redirects and no proxy).
    pub fn new(
        broker: Arc<dyn Broker>,
        (guard, secrets): (Guard, Arc<super::sign::Secrets>),
        settings: SendSettings,
        metrics: Arc<Metrics>,
        ca: Option<&crate::tls::ExtraCa>,
    ) -> Result<Self, reqwest::Error> {
        let http = crate::tls::http_client_builder(ca)?
            .dns_resolver(Arc::new(guard.clone()))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(settings.timeout)
            .user_agent(concat!("aptix-webhooks/", env!("CARGO_PKG_VERSION")))
            .build()?;
        // Every (event, outcome) series from zero: rates and alerts over them mean something
        // from the first scrape.
        for event in super::EventType::ALL {
            for outcome in OUTCOMES {
                metrics.webhook_outcome_seen(event.as_str(), outcome);
            }
        }
        Ok(Self {
            broker,
            http,
            guard,
            settings: Arc::new(settings),
            secrets,
            metrics,
            lines: None,
        })
    }

    /// The same sender telling `lines` of each batch line's finished event.
    pub fn with_lines(mut self, lines: Arc<dyn LineFinished>) -> Self {
        self.lines = Some(lines);
        self
    }

    /// Runs [`Sender::run`] on its own task.
    pub fn spawn(&self, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        let sender = self.clone();
        tokio::spawn(async move { sender.run(shutdown).await })
    }

    /// Consumes until `shutdown` fires, consuming again with backoff whenever the broker goes
    /// away; then lets the deliveries in flight finish (each is bounded by the timeout).
    pub async fn run(&self, shutdown: CancellationToken) {
        let tracker = TaskTracker::new();
        let mut backoff = Duration::from_millis(200);
        'outer: while !shutdown.is_cancelled() {
            let mut deliveries = match self.broker.consume_hooks(self.settings.concurrency).await {
                Ok(d) => {
                    info!(
                        concurrency = self.settings.concurrency,
                        "consuming webhook deliveries"
                    );
                    backoff = Duration::from_millis(200);
                    d
                }
                Err(e) => {
                    warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "cannot consume webhook deliveries; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => break 'outer,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            let mut count_every = tokio::time::interval(COUNT_EVERY);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break 'outer,
                    _ = count_every.tick() => match self.broker.hooks_waiting().await {
                        Ok(n) => self.metrics.webhook_queue(n),
                        Err(e) => debug!(error = %e, "cannot count the webhook queue"),
                    },
                    next = deliveries.recv() => match next {
                        Some(delivery) => {
                            let sender = self.clone();
                            tracker.spawn(async move { sender.handle(delivery).await });
                        }
                        None => {
                            warn!("the broker stopped delivering webhook deliveries; consuming again");
                            break;
                        }
                    }
                }
            }
        }
        tracker.close();
        tracker.wait().await;
    }

    /// One delivery, to its ack (outcome confirmed by the broker) or its requeue.
    async fn handle(&self, delivery: Delivery) {
        let Ok(mut job) = serde_json::from_slice::<HookJob>(&delivery.body) else {
            warn!(
                bytes = delivery.body.len(),
                "not a webhook delivery; dead-lettered"
            );
            let settled = self
                .broker
                .dead_hook(&delivery.body, "not a webhook delivery")
                .await;
            self.metrics.webhook_outcome("unknown", "poison");
            self.finish(delivery, settled.map(|()| "poison")).await;
            return;
        };
        let span = info_span!("webhook", event_id = %job.id, event = job.event.as_str(), tenant = %job.tenant, traceparent = job.traceparent.as_deref().unwrap_or(""));
        async {
            let started = std::time::Instant::now();
            self.metrics.webhook_started();
            let attempt = self.attempt(&job).await;
            self.metrics.webhook_finished(started.elapsed());
            job.attempts += 1;
            let now = time::OffsetDateTime::now_utc().unix_timestamp();
            let age = Duration::from_secs(u64::try_from(now - job.first_at).unwrap_or(0));
            self.metrics.webhook_attempted(age);
            let outcome = match attempt {
                Attempt::Delivered => {
                    info!(attempts = job.attempts, age_ms = age.as_millis() as u64, "webhook delivered");
                    self.metrics.webhook_delivered(age);
                    Ok("delivered")
                }
                Attempt::Refused(why) => {
                    warn!(reason = %why, "webhook refused; dead-lettered");
                    job.last_error = Some(why.clone());
                    self.dead(&job, &why).await.map(|()| "dead")
                }
                Attempt::Failed(why) => {
                    let delay = self.settings.delay_for(job.attempts);
                    job.last_error = Some(why.clone());
                    if age + delay > self.settings.give_up_after {
                        warn!(attempts = job.attempts, reason = %why, "webhook still failing at the give-up age; dead-lettered");
                        self.dead(&job, &why).await.map(|()| "dead")
                    } else {
                        warn!(attempts = job.attempts, reason = %why, retry_in_ms = delay.as_millis() as u64, "webhook failed; trying again later");
                        match serde_json::to_vec(&job) {
                            Ok(body) => self.broker.retry_hook(&body, delay).await.map(|()| "retried"),
                            Err(e) => Err(crate::queue::QueueError::Encode(Arc::new(e))),
                        }
                    }
                }
            };
            if let Ok(outcome) = &outcome {
                self.metrics.webhook_outcome(job.event.as_str(), outcome);
            }
            // A batch line's event that is over (delivered or dead) counts towards its batch's
            // completion before the delivery is acked: if that cannot be noted, the delivery
            // comes again (a duplicate the receiver de-duplicates by its id), never lost.
            if let (Ok("delivered" | "dead"), Some(line), Some(lines)) =
                (&outcome, &job.line, &self.lines)
                && let Err(e) = lines.finished(line, &job.target.url).await
            {
                warn!(batch_id = %line.batch, error = %e, "a batch line's finished event could not be noted; the delivery comes again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                let _ = delivery.requeue().await;
                return;
            }
            self.finish(delivery, outcome).await;
        }
        .instrument(span)
        .await;
    }

    async fn dead(&self, job: &HookJob, why: &str) -> Result<(), crate::queue::QueueError> {
        let body =
            serde_json::to_vec(job).map_err(|e| crate::queue::QueueError::Encode(Arc::new(e)))?;
        self.broker.dead_hook(&body, why).await
    }

    /// Acks once the outcome is confirmed; otherwise gives the delivery back after a pause
    /// (the broker could not take its retry or its dead letter).
    async fn finish(
        &self,
        delivery: Delivery,
        outcome: Result<&'static str, crate::queue::QueueError>,
    ) {
        match outcome {
            Ok(_) => {
                if let Err(e) = delivery.ack().await {
                    debug!(error = %e, "a webhook delivery's ack was lost; it comes again");
                }
            }
            Err(e) => {
                warn!(error = %e, "the webhook's outcome could not be recorded; the delivery comes again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                let _ = delivery.requeue().await;
            }
        }
    }

    /// One POST of `job`, signed.
    pub async fn attempt(&self, job: &HookJob) -> Attempt {
        let url = match self.guard.parse(&job.target.url) {
            Ok(url) => url,
            Err(e) => return Attempt::Refused(format!("the URL is refused: {e}")),
        };
        let Some(key) = super::signing_key(&self.secrets, &job.target, &job.tenant) else {
            return Attempt::Refused(format!(
                "the signing secret variable {} is not set where the delivery is sent",
                job.target.secret_env
            ));
        };
        let timestamp = time::OffsetDateTime::now_utc().unix_timestamp();
        let mut request = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        for (name, value) in key.headers(&job.id, timestamp, job.body.as_bytes()) {
            request = request.header(name, value);
        }
        if let Some(tp) = &job.traceparent {
            request = request.header(crate::trace::TRACEPARENT, tp);
        }
        match request.body(job.body.clone()).send().await {
            Ok(answer) if answer.status().is_success() => Attempt::Delivered,
            Ok(answer) => Attempt::Failed(format!("the receiver answered {}", answer.status())),
            Err(e) => {
                // The policy said no to where the name resolves now.
                if let Some(refused) = source_of::<Refused>(&e) {
                    return Attempt::Refused(format!("the URL is refused: {refused}"));
                }
                Attempt::Failed(describe(&e))
            }
        }
    }
}

/// The first error of type `E` in `e`'s chain.
fn source_of<'a, E: std::error::Error + 'static>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(found) = err.downcast_ref::<E>() {
            return Some(found);
        }
        cur = err.source();
    }
    None
}

/// An HTTP client error with its causes, once each.
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connect() {
        "cannot connect".to_string()
    } else {
        "request failed".to_string()
    };
    let mut cur = std::error::Error::source(e);
    while let Some(err) = cur {
        text.push_str(": ");
        text.push_str(&err.to_string());
        cur = err.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_repeats_its_last_delay() {
        let s = SendSettings::default();
        assert_eq!(s.delay_for(1), Duration::from_secs(5));
        assert_eq!(s.delay_for(5), Duration::from_secs(3600));
        assert_eq!(s.delay_for(40), Duration::from_secs(3600));
    }
}
