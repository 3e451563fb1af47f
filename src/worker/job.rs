//! One job, start to end: a message that is no turn dead-lettered with its reason; a turn run
//! through the pipeline; its result published (reply, waiters, watchers, webhooks) and the
//! message acknowledged, retried later or dead-lettered.
//!
//! Owns: what happens to one delivery. Must not: consume (the worker's loop does) or run the
//! pipeline's steps itself.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{Instrument as _, debug, error, info, info_span, warn};

use crate::contract::{
    AgentExecuteRequest, AgentExecuteResponse, ErrorMessage, InvokeResult, LOCAL_TENANT, SessionId,
    TurnId, parse_request,
};
use crate::delivery::Settling;
use crate::pipeline::{JobOutcome, Origin, Settled, SettledAs};
use crate::queue::Delivery;
use crate::store::TurnStatusView;
use crate::trace::TraceContext;

use super::*;

impl Worker {
    /// Handles one delivery to its ack or requeue.
    ///
    /// Returned as an `async move` block: an `async fn` would hold the delivery twice while
    /// its turn runs (as the argument it came in, and in its body).
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would hold the delivery twice"
    )]
    pub fn handle(&self, delivery: Delivery) -> impl Future<Output = ()> + Send + '_ {
        async move {
            if delivery.redelivered {
                self.stats.redeliveries.fetch_add(1, Ordering::Relaxed);
                self.metrics.redelivered();
            }
            let disposition = match parse_request(&delivery.body, &self.settings.limits) {
                // Boxed: a rare path, kept out of every turn's task (see `worker::tests`).
                Err(rejected) => Box::pin(self.unreadable(&delivery, rejected.errors)).await,
                Ok(mut parsed) => {
                    // The session is the submitting tenant's: every key and queue of the turn is
                    // made from the scoped id.
                    parsed
                        .request
                        .scope_to(delivery.tenant.as_deref().unwrap_or(LOCAL_TENANT));
                    // The trace the front door started (or joined) goes on here; a job published
                    // without one starts its own.
                    let parent = TraceContext::from_header(delivery.traceparent.as_deref());
                    let span = info_span!(
                        "job",
                        session_id = %parsed.request.session_id(),
                        turn_id = %parsed.request.turn_id(),
                        attempt = delivery.attempt + 1,
                        redelivered = delivery.redelivered,
                        trace_id = %parent.trace_id(),
                    );
                    parent.adopt(&span);
                    let trace = parent.within(&span);
                    trace
                        .scope(self.run_job(&parsed.request, &delivery).instrument(span))
                        .await
                }
            };
            let acked = match disposition {
                Disposition::Ack => delivery.ack().await,
                Disposition::Requeue => delivery.requeue().await,
            };
            if let Err(e) = acked {
                // The channel is gone; the broker redelivers the message and the store makes the
                // second run return the committed result.
                warn!(error = %e, "could not acknowledge a delivery; it will be redelivered");
            }
        }
    }

    /// A job this worker cannot read: dead-lettered. When it names a turn that was accepted
    /// and is still queued or was running (the front door read it under other limits, say),
    /// that turn is failed first with the reasons and its status published, so it does not stay
    /// `queued` behind a job that is gone.
    async fn unreadable(&self, delivery: &Delivery, errors: Vec<ErrorMessage>) -> Disposition {
        let reason = errors
            .first()
            .map(|e| format!("unparseable job: {}: {}", e.error_code, e.message))
            .unwrap_or_else(|| "unparseable job".into());
        error!(%reason, bytes = delivery.body.len(), "poison message; dead-lettering it");
        let ids = crate::queue::named_turn(&delivery.body, delivery.tenant.as_deref());
        let settled = match &ids {
            Some((sid, tid)) => {
                let why = "the front door accepted this turn, but the worker cannot read its job \
                           (are the two configured with the same APTIX_MAX_* limits?)";
                let errors = errors.into_iter().map(|e| e.with_details(why)).collect();
                match self.pipeline.fail_unreadable(sid, tid, errors).await {
                    Ok(settled) => settled,
                    Err(e) => {
                        warn!(code = %e.error.error_code, message = %e.error.message, "could not fail the turn of an unreadable job; trying again later");
                        let next = delivery.attempt + 1;
                        return self
                            .republish(delivery, delivery.attempt, self.topology.delay_for(next))
                            .await;
                    }
                }
            }
            None => None,
        };
        // The turn's status goes out before the job is dead-lettered: a publish that fails
        // runs the job again (its turn has ended: the stored status is published then), and the
        // dead-letter queue gets one copy, once the status is out.
        if let (Some((sid, tid)), Some(settled)) = (&ids, settled) {
            let turn = TurnOf {
                session: sid,
                turn: tid,
                user_turn: false,
            };
            if let Err(later) = self.publish_settled(turn, delivery, settled, None).await {
                return later;
            }
        }
        if let Err(e) = self
            .broker
            .publish_dead(&delivery.body, &delivery.meta(), &reason)
            .await
        {
            error!(error = %e, "could not dead-letter a poison message");
            // Held a moment first, as a refused retry is: no loop of failed publishes.
            tokio::time::sleep(self.settings.busy_delay).await;
            return Disposition::Requeue;
        }
        self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
        self.metrics.dead_lettered();
        Disposition::Ack
    }

    async fn run_job(&self, request: &AgentExecuteRequest, delivery: &Delivery) -> Disposition {
        let started = Started::now();
        let outcome = {
            let _in_flight = self.metrics.run_started();
            let _running = self.metrics.pulse().running(delivery.tenant.as_deref());
            self.pipeline
                .execute_as(
                    Origin {
                        tenant: delivery.tenant.as_deref(),
                        reply_to: delivery.reply_to.as_deref(),
                        job: Some(&delivery.body),
                    },
                    request,
                    self.settings.turn_deadline,
                )
                .await
        };
        let failure = match outcome {
            JobOutcome::Done(settled) => {
                // Boxed: the delivery's state (4.6 KB) is needed once the run is over, and
                // unboxed every turn waiting on its model would carry it.
                return Box::pin(self.reply(request.into(), delivery, *settled, Some(started)))
                    .await;
            }
            // A duplicate or a race the front door could not see must not publish a "failed"
            // status over the turn's real one: the run that produced that status published it.
            JobOutcome::NotTheTurns(reasons) => {
                for e in &reasons {
                    warn!(code = %e.error_code, message = %e.message, "job does not apply to its turn; dropping it without a reply");
                }
                return Disposition::Ack;
            }
            JobOutcome::Busy => {
                self.stats.busy.fetch_add(1, Ordering::Relaxed);
                self.metrics.job_retry("session_busy");
                return Box::pin(self.republish(
                    delivery,
                    delivery.attempt,
                    self.settings.busy_delay,
                ))
                .await;
            }
            JobOutcome::NoCapacity(why) => {
                info!(message = %why.message, "no model capacity; the job runs again shortly at the same attempt");
                self.metrics.job_retry("model_capacity");
                return Box::pin(self.republish(
                    delivery,
                    delivery.attempt,
                    self.settings.busy_delay,
                ))
                .await;
            }
            JobOutcome::Retry(failure) => failure,
        };
        let next = delivery.attempt + 1;
        if next < self.settings.max_attempts {
            let delay = self.topology.delay_for(next);
            warn!(code = %failure.error_code, message = %failure.message, retry = next, delay_ms = delay.as_millis() as u64, "transient failure; retrying later");
            self.stats.retried.fetch_add(1, Ordering::Relaxed);
            self.metrics.job_retry("transient");
            return Box::pin(self.republish(delivery, next, delay)).await;
        }
        // Boxed: a rare path (its stored failure and the dead-lettering's state, ~2 KB) kept
        // out of every turn's task, as are the others here, the republishing ones included
        // (see `worker::tests`).
        Box::pin(self.give_up(request, delivery, failure, next)).await
    }

    /// The retry limit reached: the turn failed with the last error (stored, then published)
    /// and its job dead-lettered.
    async fn give_up(
        &self,
        request: &AgentExecuteRequest,
        delivery: &Delivery,
        failure: ErrorMessage,
        next: u32,
    ) -> Disposition {
        let reason = format!(
            "gave up after {next} attempts; last error {}: {}",
            failure.error_code, failure.message
        );
        error!(%reason, "retry limit reached; failing the turn and dead-lettering the job");
        let final_error = ErrorMessage::new(failure.error_code, reason.clone());
        let result = match self.pipeline.give_up(request, final_error).await {
            Ok(r) => r,
            // The failure cannot be stored, and nothing is published that is not stored: try
            // again later, at the same attempt, until the store answers.
            Err(e) => {
                warn!(code = %e.error.error_code, message = %e.error.message, "could not store the turn's failure; trying again later");
                return self
                    .republish(delivery, delivery.attempt, self.topology.delay_for(next))
                    .await;
            }
        };
        if let Err(e) = self
            .broker
            .publish_dead(&delivery.body, &delivery.meta().at_attempt(next), &reason)
            .await
        {
            error!(error = %e, "could not dead-letter the job; requeueing it");
            return Disposition::Requeue;
        }
        self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
        self.metrics.dead_lettered();
        self.reply(request.into(), delivery, result, None).await
    }

    async fn republish(&self, delivery: &Delivery, attempt: u32, delay: Duration) -> Disposition {
        match self
            .broker
            .publish_retry(&delivery.body, delay, &delivery.meta().at_attempt(attempt))
            .await
        {
            Ok(()) => Disposition::Ack,
            Err(e) => {
                // Held a moment before it goes back: a broker that takes nothing would
                // otherwise see the same job again at once, over and over.
                warn!(error = %e, "could not schedule the retry; requeueing");
                tokio::time::sleep(self.settings.busy_delay).await;
                Disposition::Requeue
            }
        }
    }

    /// Publishes the turn's status, as stored, to the session's replies. Only a result the
    /// store holds is published: a client told of a result can always read it back. A result
    /// this run stored goes out with the status it was stored with; a stored result found
    /// again (a duplicate job) is read back first, in case the turn has moved on since.
    async fn reply(
        &self,
        request: TurnOf<'_>,
        delivery: &Delivery,
        settled: Settled,
        started: Option<Started>,
    ) -> Disposition {
        match self
            .publish_settled(request, delivery, settled, started)
            .await
        {
            Ok(()) => Disposition::Ack,
            Err(later) => later,
        }
    }

    /// [`Worker::reply`] without the ack: `Ok` once the status is published (or there is
    /// nothing of this job's to publish), else what to do with the job instead (run it again
    /// later, which publishes the stored result then).
    async fn publish_settled(
        &self,
        request: TurnOf<'_>,
        delivery: &Delivery,
        settled: Settled,
        started: Option<Started>,
    ) -> Result<(), Disposition> {
        let reply_to = delivery.reply_to.as_deref();
        let watched = settled.watched;
        let view = match settled.into_status() {
            SettledAs::Stored(view) => view,
            SettledAs::Found(result) => match self.current_status(request, &result).await {
                Ok(Some(view)) => view,
                Ok(None) => return Ok(()),
                Err(requeue) => return Err(requeue),
            },
        };
        let status = view.status;
        let turn = Settling {
            reply_to,
            audience: crate::queue::Audience {
                watched,
                reply_queue_wanted: delivery.reply_queue_wanted,
            },
            tenant: delivery.tenant.as_deref(),
            webhook: delivery.webhook.as_deref(),
            traceparent: delivery.traceparent.as_deref(),
            batch: delivery.batch.as_deref(),
        };
        let delivered = self
            .delivery
            .settle(self.quotas.tenants(), &view, turn)
            .await;
        match delivered {
            Ok(()) => {
                self.stats.completed.fetch_add(1, Ordering::Relaxed);
                self.metrics.turn_finished(status.as_str());
                if let Some(started) = started {
                    let ran = started.at.elapsed();
                    self.metrics.observe_turn_duration(ran);
                    // A continuation's record dates from the user turn, before the client ran
                    // its tools; only a user turn's wait is time spent queued.
                    let user_turn = request.user_turn;
                    let waited = Some(&view)
                        .filter(|_| user_turn)
                        .and_then(|v| started.since_rfc3339(&v.submitted_at));
                    if let Some(wait) = waited {
                        self.metrics.observe_queue_wait(wait);
                    }
                    self.metrics
                        .pulse()
                        .settled(status, waited.unwrap_or_default() + ran);
                }
                debug!(status = status.as_str(), "result published");
                Ok(())
            }
            Err(e) => {
                // The job runs again after the first retry delay and delivers the stored
                // result then: once the store's replicas hold it (a failover now could lose
                // it, so nobody is told yet), or once the broker takes it (a reply queue whose
                // node is down, say, until the node is back) — never at once, which would turn
                // an outage into a loop of failed publishes.
                let delay = self.topology.delay_for(1);
                warn!(error = %e, reason = e.reason(), delay_ms = delay.as_millis() as u64, "could not deliver the result; the job will run again and deliver it");
                self.metrics.job_retry(e.reason());
                Err(self.republish(delivery, delivery.attempt, delay).await)
            }
        }
    }

    /// The turn's status if it still holds `result` (settled); `None` when it moved on (a
    /// continuation was accepted, or it expired): the run that settles it publishes its
    /// result. `Err` (requeue, after a pause) when the store cannot be read.
    async fn current_status(
        &self,
        request: TurnOf<'_>,
        result: &InvokeResult<AgentExecuteResponse>,
    ) -> Result<Option<TurnStatusView>, Disposition> {
        let (sid, tid) = (request.session, request.turn);
        let record = match self.pipeline.store().get_turn(sid, tid).await {
            Ok(r) => r,
            Err(e) => {
                // The store is down: hold the delivery a moment before giving it back, so an
                // outage does not turn into a redelivery loop.
                warn!(error = %e, "cannot read the turn back before publishing its result; the job will run again");
                tokio::time::sleep(self.settings.busy_delay).await;
                return Err(Disposition::Requeue);
            }
        };
        match record.filter(|r| r.status.is_settled() && r.result.as_deref() == Some(result)) {
            Some(r) => Ok(Some(TurnStatusView::from(r))),
            None => {
                warn!("the turn no longer holds this result; not publishing it");
                Ok(None)
            }
        }
    }
}

/// The turn a job is for, as its reply needs it.
#[derive(Clone, Copy)]
struct TurnOf<'a> {
    session: &'a SessionId,
    turn: &'a TurnId,
    /// A user turn (its queue wait is measured), not a continuation.
    user_turn: bool,
}

impl<'a> From<&'a AgentExecuteRequest> for TurnOf<'a> {
    fn from(request: &'a AgentExecuteRequest) -> Self {
        Self {
            session: request.session_id(),
            turn: request.turn_id(),
            user_turn: matches!(request, AgentExecuteRequest::UserTurn(_)),
        }
    }
}
