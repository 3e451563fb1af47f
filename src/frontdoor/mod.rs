//! The front door's core: validate a request, apply the idempotency rules, record the turn as
//! queued and enqueue it — and say "accepted" only once the broker confirmed the job.
//!
//! Owns: what happens between a request body and an accepted job. Must not: run turns. The HTTP
//! API and the CLI clients sit on top of this.

use std::sync::Arc;

use crate::contexts::{KnownContexts, context_mismatches};
use crate::contract::{
    AgentExecuteRequest, ErrorCode, ErrorMessage, LOCAL_TENANT, OnBusy, RequestLimits,
    RequestRejected, SessionId, TurnId, UserTurn, parse_request,
};
use crate::delivery::ResultDelivery;
use crate::metrics::Metrics;
use crate::pipeline::{Intake, continuation_fingerprint, job_fingerprint};
use crate::queue::{Broker, JobMeta};
use crate::tenants::{QuotaError, Quotas};
use crate::trace::TraceContext;
use crate::webhooks::guard::Guard;
pub mod batch;
mod batch_results;
mod batch_retry;
mod body;
pub mod cancel;
mod console;
mod continuation;
mod counted;
mod error;
pub mod extract;
mod h1;
pub mod http;
mod links;
pub mod openapi;
mod pickup;
pub mod routes;
pub mod runs;
mod serve;

pub use error::SubmitError;
pub use pickup::Pickup;

use continuation::Acceptance;

use crate::state::Admitted;
use crate::store::{
    Admission, ContextIds, IndexedTurn, RecordWriter, RunsNote, SessionStore, TurnRecord,
    TurnStatus, TurnStatusView,
};

/// Accepts requests.
#[derive(Clone)]
pub struct FrontDoor {
    /// Reads, and the writes that are not a turn's state (owners, cancel requests, batches):
    /// it cannot write a turn; every write of a turn goes through `intake` (layer F).
    store: Arc<dyn RecordWriter>,
    intake: Intake,
    broker: Arc<dyn Broker>,
    /// Where a cancelled turn's status goes, and how waiters hear of turns.
    delivery: ResultDelivery,
    /// Where a submission's webhook may point.
    webhook_guard: Guard,
    /// The signing secrets set here (a webhook nothing could sign is refused).
    webhook_secrets: Arc<crate::webhooks::sign::Secrets>,
    limits: RequestLimits,
    contexts: KnownContexts,
    metrics: Arc<Metrics>,
    quotas: Quotas,
}

impl FrontDoor {
    /// A front door over a store and a broker.
    pub fn new(
        store: Arc<dyn SessionStore>,
        broker: Arc<dyn Broker>,
        limits: RequestLimits,
    ) -> Self {
        Self {
            intake: Intake::new(store.clone()),
            delivery: ResultDelivery::new(store.clone(), broker.clone()),
            webhook_guard: Guard::default(),
            webhook_secrets: Arc::default(),
            store,
            broker,
            limits,
            contexts: KnownContexts::default(),
            metrics: Arc::default(),
            quotas: Quotas::default(),
        }
    }

    /// Holds submissions' webhook URLs to `guard` (the default: https to public addresses)
    /// and accepts them for tenants whose signing secret is among `secrets`.
    pub fn with_webhooks(
        mut self,
        guard: Guard,
        secrets: Arc<crate::webhooks::sign::Secrets>,
    ) -> Self {
        self.webhook_guard = guard;
        self.webhook_secrets = secrets;
        self
    }

    /// Refuses a submission's webhook URL that the policy refuses (`WEBHOOK_REFUSED`), or
    /// that nothing could sign here (`WEBHOOK_SECRET_MISSING`).
    async fn admit_webhook(&self, tenant: Option<&str>, url: &str) -> Result<(), SubmitError> {
        let refused = |code: ErrorCode, message: String| {
            SubmitError::Invalid(RequestRejected {
                errors: vec![ErrorMessage::new(code, message)],
                warnings: Vec::new(),
            })
        };
        // The secret first: it costs no DNS lookup.
        let env = self
            .quotas
            .tenants()
            .signing_env(tenant.unwrap_or_default());
        if !self.webhook_secrets.contains_key(env) {
            return Err(refused(
                ErrorCode::WebhookSecretMissing,
                format!(
                    "webhook: the variable {env} with the tenant's signing secret (whsec_…) is not set on the server"
                ),
            ));
        }
        match self.webhook_guard.check(url).await {
            Ok(_) => {}
            Err(e @ crate::webhooks::guard::Refused::Malformed(_)) => {
                return Err(refused(
                    ErrorCode::InvalidWebhook,
                    format!("webhook.url {e}"),
                ));
            }
            Err(e) => {
                return Err(refused(
                    ErrorCode::WebhookRefused,
                    format!("webhook.url {e}"),
                ));
            }
        }
        Ok(())
    }

    /// How this front door's waiters hear of turns (see [`crate::delivery`]).
    pub fn delivery(&self) -> &ResultDelivery {
        &self.delivery
    }

    /// Refuses the user turns of tenants whose token quota is spent, and puts capped tenants'
    /// jobs on their lanes.
    pub fn with_quotas(mut self, quotas: Quotas) -> Self {
        self.quotas = quotas;
        self
    }

    /// The tenants' quotas.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// Refuses user turns that name other contexts than these (default: only `default`).
    pub fn with_contexts(mut self, contexts: KnownContexts) -> Self {
        self.contexts = contexts;
        self
    }

    /// The contexts requests may name.
    pub fn contexts(&self) -> &KnownContexts {
        &self.contexts
    }

    /// Checks what the request names against the configuration (today: its contexts); the
    /// errors are `UNKNOWN_CONTEXT`, with nothing enqueued.
    pub fn check_configured(&self, request: &AgentExecuteRequest) -> Result<(), RequestRejected> {
        match request {
            AgentExecuteRequest::UserTurn(turn) => {
                self.contexts.check(turn).map_err(|errors| RequestRejected {
                    errors,
                    warnings: Vec::new(),
                })
            }
            AgentExecuteRequest::ToolContinuation(_) => Ok(()),
        }
    }

    /// Latches the turn's contexts as its session's unless the session latched some already;
    /// a turn that names other ones than the session's is refused with `CONTEXT_MISMATCH`.
    async fn latch_contexts(&self, turn: &UserTurn) -> Result<ContextIds, SubmitError> {
        let (agent, conversation) = (turn.agent_context_id(), turn.conversation_context_id());
        let latched = self
            .store
            .latch_contexts(
                turn.session_id(),
                &ContextIds::named_or_default(agent, conversation),
            )
            .await?;
        self.check_latched(turn, &latched)?;
        Ok(latched)
    }

    /// Refuses, with `CONTEXT_MISMATCH`, a turn that names other contexts than the ones its
    /// session latched.
    fn check_latched(&self, turn: &UserTurn, latched: &ContextIds) -> Result<(), SubmitError> {
        let (agent, conversation) = (turn.agent_context_id(), turn.conversation_context_id());
        let errors = context_mismatches(turn.session_id(), latched, agent, conversation);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(SubmitError::Invalid(RequestRejected {
                errors,
                warnings: Vec::new(),
            }))
        }
    }

    /// Counts accepted turns and suppressed duplicates in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The metrics this front door records in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Checks that `tenant` may submit `request`: a user turn needs the tenant's token quota
    /// not to be spent; a continuation (the rest of an accepted turn) needs nothing more, as
    /// it can only name a turn of the tenant's own sessions (its id is scoped to the tenant).
    pub async fn authorize(
        &self,
        tenant: &str,
        request: &AgentExecuteRequest,
    ) -> Result<(), SubmitError> {
        if let AgentExecuteRequest::UserTurn(_) = request
            && let Err(e) = self.quotas.check_tokens(tenant).await
        {
            if matches!(e, QuotaError::Exceeded(_)) {
                self.metrics.turn_refused_by_policy("quota_exceeded");
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// Records a new user turn as queued, with its session claimed for `tenant` and its
    /// contexts latched: in one store step when the turn queues behind whatever the session
    /// runs (`onBusy: enqueue`, the default); otherwise its onBusy policy acts between the
    /// latch and the record. Returns the record that was there, if any.
    ///
    /// The other steps are boxed, and so is a record found: this future is part of every
    /// submission's, which the handler boxes (copies) whole.
    async fn record_user_turn(
        &self,
        tenant: Option<&str>,
        turn: &UserTurn,
        fresh: &TurnRecord,
        accepted_ms: i64,
    ) -> Result<(Option<Box<TurnRecord>>, RunsNote), SubmitError> {
        let (sid, tid) = (turn.session_id(), turn.turn_id());
        let tenant = claimant(tenant, sid);
        if turn.on_busy() != OnBusy::Enqueue {
            let recorded = Box::pin(self.record_on_busy(tenant, turn, fresh)).await?;
            return Ok((recorded, RunsNote::Yours));
        }
        let (agent, conversation) = (turn.agent_context_id(), turn.conversation_context_id());
        let wanted = ContextIds::named_or_default(agent, conversation);
        let (admission, noted) = (self.intake)
            .admit(tenant, &wanted, fresh, accepted_ms)
            .await?;
        match admission {
            Admission::Turn(existing) => Ok((existing, noted)),
            Admission::OtherOwner => Err(not_found(sid, tid)),
            Admission::OtherContexts(latched) => {
                // Leaving a field out means "the session's": still one it may run with.
                self.check_latched(turn, &latched)?;
                let created = self.intake.create(fresh).await?;
                Ok((created.map(Box::new), RunsNote::Yours))
            }
        }
    }

    /// [`FrontDoor::record_user_turn`] for a turn with an onBusy policy other than `enqueue`:
    /// owner claimed (`tenant`: the [`claimant`]), contexts latched, the policy applied, then
    /// the record.
    async fn record_on_busy(
        &self,
        tenant: Option<&str>,
        turn: &UserTurn,
        fresh: &TurnRecord,
    ) -> Result<Option<Box<TurnRecord>>, SubmitError> {
        let (sid, tid) = (turn.session_id(), turn.turn_id());
        if let Some(tenant) = tenant
            && self.store.claim_owner(sid, tenant).await? != tenant
        {
            return Err(not_found(sid, tid));
        }
        self.latch_contexts(turn).await?;
        self.on_busy(turn).await?;
        Ok(self.intake.create(fresh).await?.map(Box::new))
    }

    /// Parses a request body against this front door's limits (every violation listed).
    pub fn parse(&self, body: &[u8]) -> Result<AgentExecuteRequest, SubmitError> {
        parse_request(body, &self.limits)
            .map(|parsed| parsed.request)
            .map_err(SubmitError::Invalid)
    }

    /// The one way in: checks that `tenant` may submit `request` ([`FrontDoor::authorize`])
    /// and enqueues it as the tenant's (`LOCAL_TENANT` for a deployment without tenants): on
    /// its lane when its running turns are capped, its tokens counted to it, as part of
    /// `trace`. `pickup` says how the submitter will come for the result.
    pub async fn submit(
        &self,
        tenant: &str,
        request: &AgentExecuteRequest,
        trace: &TraceContext,
        pickup: Pickup<'_>,
    ) -> Result<TurnStatusView, SubmitError> {
        let request = request.within(tenant);
        self.authorize(tenant, &request).await?;
        self.enqueue_request(&request, trace, Some(tenant), pickup)
            .await
    }

    async fn enqueue_request(
        &self,
        request: &AgentExecuteRequest,
        trace: &TraceContext,
        tenant: Option<&str>,
        pickup: Pickup<'_>,
    ) -> Result<TurnStatusView, SubmitError> {
        // The session is the tenant's (every key and queue below is made from the scoped id;
        // the job carries the client's id and the tenant, and the worker scopes it again).
        let request = &*request.within(tenant.unwrap_or(LOCAL_TENANT));
        // `trace` is the front door's own position in the trace (see `extract::trace_of`).
        let traceparent = trace.header();
        let reply_to = pickup.reply_to;
        let mut meta = JobMeta::new(Some(traceparent.as_str()), tenant)
            .replying_to(reply_to)
            .wanting_reply_queue(pickup.reply_queue_wanted)
            .in_batch(pickup.batch.map(|(id, _)| id));
        let lane = self.quotas.lane_of(tenant);
        self.check_configured(request)
            .map_err(SubmitError::Invalid)?;
        let (sid, tid) = (request.session_id(), request.turn_id());
        let job = serde_json::to_vec(request)
            .map_err(|e| SubmitError::Unavailable(format!("cannot encode the job: {e}")))?;
        match request {
            AgentExecuteRequest::UserTurn(turn) => {
                let own = turn.webhook().map(|w| w.url.as_str());
                if let Some(url) = own {
                    self.admit_webhook(tenant, url).await?;
                }
                // A batch line without a webhook of its own gets the batch's.
                let webhook = own.or(pickup.batch.and_then(|(_, w)| w));
                meta = meta.with_webhook(webhook);
                // The job is the turn serialised: its digest is the turn's fingerprint.
                let fp = job_fingerprint(&job);
                // What the client asked, kept for people looking into the turn unless the
                // tenant's bodies are not kept.
                let keeps = tenant.is_none_or(|t| self.quotas.tenants().keeps_bodies(t));
                let input = keeps.then(|| {
                    let paths = turn
                        .input_artifacts()
                        .iter()
                        .map(|a| a.relative_path().as_str());
                    crate::state::TurnInput::of(turn.instruction(), paths)
                });
                // Boxed: a record is large, and this future is copied whole when boxed.
                let fresh = Box::new(TurnRecord::admitted(
                    sid.clone(),
                    tid.clone(),
                    fp.clone(),
                    Admitted {
                        input,
                        reply_to,
                        streaming: turn.streaming(),
                        webhook,
                        batch: pickup.batch.map(|(id, _)| id),
                        service_tier: pickup
                            .service_tier
                            .map(crate::contexts::ServiceTier::as_str),
                    },
                ));
                let accepted_ms = crate::store::now_ms();
                let recorded = self.record_user_turn(tenant, turn, &fresh, accepted_ms);
                let (created, noted) = match recorded.await {
                    Ok(recorded) => recorded,
                    Err(e) => {
                        // A write that timed out may still be applied later (a stalled link
                        // delivers it when it recovers): take it back the same way, so no turn
                        // is left recorded as queued without a job.
                        if matches!(e, SubmitError::Unavailable(_))
                            && let Err(d) = self.intake.take_back(&fresh).await
                        {
                            tracing::warn!(session_id = %sid, turn_id = %tid, error = %d, "could not take back a turn record whose write failed");
                        }
                        return Err(e);
                    }
                };
                match created {
                    None => {}
                    Some(existing) if existing.fingerprint != fp => {
                        return Err(SubmitError::Conflict(ErrorMessage::new(
                            ErrorCode::TurnConflict,
                            format!(
                                "turn {tid} already exists in session {} with a different payload",
                                sid.client_id()
                            ),
                        )));
                    }
                    // Accepted before and still queued: its job may not have been confirmed,
                    // so enqueue again (a duplicate job is harmless: turns are idempotent).
                    Some(existing) if existing.status == TurnStatus::Queued => {}
                    Some(existing) => {
                        // Noted again as the admission's script would have (a first note
                        // lost with a front door that stopped keeps no turn out of the lists).
                        if noted == RunsNote::Yours {
                            let run = IndexedTurn::of(accepted_ms, sid, tid);
                            self.noted(sid, tid, self.store.index_turn(run)).await;
                        }
                        self.metrics.duplicate_suppressed("frontdoor");
                        return Ok(TurnStatusView::from(*existing));
                    }
                }
                // The runs index is noted by the admission where the store can, else beside
                // the enqueue (no trip of its own in a row: handed in before it, its answer
                // asked for after it, when it is usually there); a turn whose job is not
                // accepted leaves an entry its readers skip.
                let enqueued = match noted {
                    RunsNote::Noted => self.broker.enqueue(lane, &job, &meta).await,
                    RunsNote::Missed(why) => {
                        self.run_missed(sid, tid, &why);
                        self.broker.enqueue(lane, &job, &meta).await
                    }
                    RunsNote::Yours => {
                        let run = IndexedTurn::of(accepted_ms, sid, tid);
                        let noting = self.store.index_turn(run);
                        let enqueued = self.broker.enqueue(lane, &job, &meta).await;
                        self.noted(sid, tid, noting).await;
                        enqueued
                    }
                };
                if let Err(e) = enqueued {
                    // Not accepted: take back the record so no turn waits for a job that does
                    // not exist (unless a concurrent resubmission already moved it on).
                    if let Err(d) = self.intake.take_back(&fresh).await {
                        tracing::warn!(session_id = %sid, turn_id = %tid, error = %d, "could not discard the record of a turn whose job was not accepted; a resubmission enqueues it");
                    }
                    return Err(e.into());
                }
                self.metrics.turn_accepted();
                Ok(TurnStatusView::from(*fresh))
            }
            AgentExecuteRequest::ToolContinuation(cont) => {
                let fp = continuation_fingerprint(cont);
                // Boxed: its state is large, and a user turn's submission would carry it.
                let accepted = Box::pin(self.accept_continuation(cont, &fp, reply_to)).await?;
                match accepted {
                    Acceptance::Moved { before, after } => {
                        // The user turn's webhook hears of its continuations too.
                        let meta = meta.with_webhook(before.webhook.as_deref());
                        if let Err(e) = self.broker.enqueue(lane, &job, &meta).await {
                            // Not accepted: put the turn back to waiting for its tools, unless
                            // something moved it on meanwhile.
                            match self.intake.take_back_continuation(&after, &before).await {
                                Ok(true) => {}
                                Ok(false) => {
                                    tracing::warn!(session_id = %sid, turn_id = %tid, "a continuation whose job was not accepted could not be taken back: the turn moved on")
                                }
                                Err(d) => {
                                    tracing::warn!(session_id = %sid, turn_id = %tid, error = %d, "could not take back a continuation whose job was not accepted; sending it again enqueues it")
                                }
                            }
                            return Err(e.into());
                        }
                        self.metrics.turn_accepted();
                        Ok(TurnStatusView::from(after.as_ref()))
                    }
                    Acceptance::Again(record) => {
                        // Accepted before and still queued: its job may not have been
                        // confirmed, so enqueue again (the worker runs it once).
                        if record.status == TurnStatus::Queued {
                            let meta = meta.with_webhook(record.webhook.as_deref());
                            self.broker.enqueue(lane, &job, &meta).await?;
                        }
                        self.metrics.duplicate_suppressed("frontdoor");
                        Ok(TurnStatusView::from(record.as_ref()))
                    }
                }
            }
        }
    }
}

impl FrontDoor {
    /// Waits for the runs index note of `sid`'s turn `tid` (handed in already) to be
    /// answered. A note that fails is logged and counted, not refused: the turn is accepted
    /// all the same, and only the lists miss its line.
    async fn noted(&self, sid: &SessionId, tid: &TurnId, noting: crate::store::Noting) {
        if let Err(e) = noting.await {
            self.run_missed(sid, tid, &e);
        }
    }

    /// Logs and counts a runs index note that failed.
    fn run_missed(&self, sid: &SessionId, tid: &TurnId, why: &dyn std::fmt::Display) {
        self.metrics.runs_index_missed();
        tracing::warn!(session_id = %sid, turn_id = %tid, error = %why, "could not note a turn in the runs index; it is accepted, but the turns list will not show it");
    }
}

/// The refusal for another tenant's session: the same as for a turn that does not exist.
fn not_found(sid: &SessionId, tid: &TurnId) -> SubmitError {
    SubmitError::NotFound(ErrorMessage::new(
        ErrorCode::TurnNotFound,
        format!("turn {tid} does not exist in session {}", sid.client_id()),
    ))
}

/// Whom to claim a session's first turn for: no one for a scoped id (its keys name its
/// tenant, so no other tenant's request can reach them: nothing to claim, one write fewer for
/// each new session); the tenant for a bare id — the local tenant's, whose ids a session from
/// before ids were scoped may hold, owned by another tenant.
fn claimant<'a>(tenant: Option<&'a str>, sid: &SessionId) -> Option<&'a str> {
    tenant.filter(|_| sid.tenant() == LOCAL_TENANT)
}
