//! The agent pipeline, one file per layer of AGN-027: [`compose`] (B: the model request, the
//! boot prompt and the `[CONTEXT]` block), the model call in [`crate::llm`] (C),
//! `server_tools` (D: one server tool call, or its output replayed from the turn's ledger),
//! `reasoner` (E: the only loop; mode changes are decided there; a user turn's run is opened
//! before it in `opening`) and [`lifecycle`] (F: the only writer of a turn's state — the lease
//! and every transition, each one atomic store step). This file holds the entry points
//! ([`Pipeline::run`], [`Pipeline::execute`]), the settings and retrieval for the context block.
//!
//! A failure fails the **turn**, never the session: the session's continuation id is only moved
//! forward when a turn reaches a point where every function call of the last response has been
//! answered, and only in the step that stores the answer its client is given.

pub mod backends;
mod background_call;
pub(crate) mod boxed;
mod call_reads;
mod cancel_watch;
pub mod compose;
mod continuation;
mod history;
mod hosted;
pub mod lifecycle;
pub(crate) mod model_call;
mod opening;
mod outcome;
mod reasoner;
mod server_tools;
#[cfg(test)]
mod tests;
pub(crate) mod until_cancelled;

pub use backends::{AgentBackend, Backends, Conversation};
pub use compose::DEFAULT_BOOT_PROMPT;
pub use lifecycle::Intake;
use outcome::{Interrupted, TurnPrint, TurnResult};
pub use outcome::{
    JobOutcome, Origin, PipelineSettings, RetryKind, RetryableFailure, Settled, SettledAs,
    continuation_fingerprint, fingerprint, job_fingerprint,
};

tokio::task_local! {
    /// When the turn being run must be over ([`Pipeline::execute_as`]'s deadline): a model
    /// call that would outlive it is stopped (a background one on the server too) just
    /// before, rather than dropped at that moment.
    static TURN_DEADLINE: tokio::time::Instant;
}

use std::sync::Arc;
use std::time::Duration;

use tracing::{Instrument as _, debug, info, info_span, warn};

use crate::catalog::ModeCatalog;
use crate::contexts::KnownContexts;
use crate::contract::{AgentExecuteRequest, ErrorCode, ErrorMessage, SessionId, UserTurn};
use crate::live::{LiveOutlet, LiveSettings, LiveTurn};
use crate::llm::LlmClient;
use crate::metrics::Metrics;
use crate::rag::{RagBudget, RagQuery, Retriever};
use crate::store::{RecordWriter, SessionStore, StoreReader};
use crate::tools::ToolRegistry;

/// Runs turns.
#[derive(Clone)]
pub struct Pipeline {
    /// Layer F: the turn's transitions, the only holder of the store's writer here.
    life: lifecycle::Lifecycle,
    /// What the reasoner reads of the store (a waiting turn, its session).
    reader: Arc<dyn StoreReader>,
    catalog: Arc<ModeCatalog>,
    /// Layer C: the model calls (reads the store, never writes it).
    model: model_call::ModelCaller,
    /// Layer D: the server tools (neither a model client nor the store).
    tools: server_tools::ServerTools,
    /// The backends' context ids, computed once.
    contexts: Arc<KnownContexts>,
    rag: Option<Rag>,
}

/// Retrieval for the `[CONTEXT]` block.
#[derive(Clone)]
struct Rag {
    retriever: Arc<dyn Retriever>,
    budget: RagBudget,
    /// The index lives on the session store's server: the begin step may look whether a
    /// tenant has one ([`Retriever::absence_probe`]).
    on_store: bool,
}

impl Pipeline {
    /// A pipeline over a store, catalog and model client, with the built-in server tools.
    pub fn new(
        store: Arc<dyn SessionStore>,
        catalog: Arc<ModeCatalog>,
        llm: LlmClient,
        settings: PipelineSettings,
    ) -> Result<Self, crate::tools::UnimplementedTool> {
        let tools = ToolRegistry::builtin(catalog.clone());
        tools.check_catalog(&catalog)?;
        let backends = Backends::single(
            AgentBackend {
                llm,
                model: settings.model.clone(),
                replay: settings.replay,
                prompt_caching: true,
                calls: Default::default(),
            },
            DEFAULT_BOOT_PROMPT,
        );
        let metrics = Arc::<Metrics>::default();
        Ok(Self {
            contexts: Arc::new(backends.known()),
            model: model_call::ModelCaller::new(
                backends,
                catalog.clone(),
                metrics.clone(),
                Arc::new(call_reads::StoreCallReads(store.clone())),
                cancel_watch::CancelWatch::new(store.clone(), lifecycle::CANCEL_POLL),
            ),
            life: lifecycle::Lifecycle::new(
                store.clone(),
                catalog.clone(),
                Arc::new(settings),
                metrics,
            ),
            reader: store,
            catalog,
            tools: server_tools::ServerTools::new(tools),
            rag: None,
        })
    }

    /// Runs turns with these contexts instead of the one `default` pair made from the
    /// settings (see [`crate::app::App::build`]).
    pub fn with_backends(mut self, backends: Backends) -> Self {
        self.contexts = Arc::new(backends.known());
        self.model.backends = Arc::new(backends);
        self
    }

    /// Offers the tools of these MCP sources as server tools too (layer D runs them).
    pub fn with_mcp(mut self, mcp: crate::mcp::McpTools) -> Self {
        self.tools = self.tools.with_mcp(mcp);
        self
    }

    /// Adds retrieved chunks to every user turn's `[CONTEXT]` block, within `budget`.
    pub fn with_rag(mut self, retriever: Arc<dyn Retriever>, budget: RagBudget) -> Self {
        self.rag = Some(Rag {
            retriever,
            budget,
            on_store: false,
        });
        self
    }

    /// Says the retriever's index lives on the session store's own server (the Redis index
    /// of a Redis deployment): a turn's begin step then looks whether the tenant has an index,
    /// and a tenant without one costs no read of its own (see [`Retriever::absence_probe`]).
    pub fn with_rag_on_store(mut self) -> Self {
        if let Some(rag) = &mut self.rag {
            rag.on_store = true;
        }
        self
    }

    /// The key the begin step is to look up for retrieval, where it can (see
    /// [`Pipeline::with_rag_on_store`]).
    fn retrieval_probe(&self, sid: &SessionId) -> Option<String> {
        let rag = self.rag.as_ref().filter(|r| r.on_store)?;
        if !self.life.steps_reach_other_keys() {
            return None;
        }
        rag.retriever.absence_probe(sid.tenant())
    }

    /// The request's artifacts plus, with retrieval configured, the chunks retrieved for the
    /// turn (scoped by its `ragScope`, in rank order, cut to the budget). Retrieval is
    /// advisory: when the index cannot be read the turn goes on with its artifacts alone.
    ///
    /// Chunks are the tenant's whose session it is (the session id is scoped to it).
    async fn context_chunks(&self, sid: &SessionId, turn: &UserTurn) -> Vec<compose::ContextChunk> {
        let artifacts = compose::artifact_chunks(turn);
        let Some(rag) = &self.rag else {
            return artifacts;
        };
        let tenant = sid.tenant();
        let mut text = turn.instruction().unwrap_or_default().to_string();
        // Artifact names without their extensions: `.md` would match every Markdown chunk.
        for a in turn.input_artifacts() {
            let name = a
                .relative_path()
                .as_str()
                .rsplit('/')
                .next()
                .unwrap_or_default();
            text.push(' ');
            text.push_str(name.rsplit_once('.').map_or(name, |(stem, _)| stem));
        }
        let query = RagQuery {
            text,
            conditions: turn
                .rag_scope()
                .map(|s| s.conditions.clone())
                .unwrap_or_default(),
            exclude_paths: turn
                .input_artifacts()
                .iter()
                .map(|a| a.relative_path().as_str().to_string())
                .collect(),
            limit: rag.budget.max_chunks,
        };
        let retrieved = match rag.retriever.retrieve(tenant, &query).await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "retrieval failed; the turn goes on without retrieved context");
                return artifacts;
            }
        };
        let found = retrieved.len();
        let retrieved: Vec<_> = retrieved.iter().map(|s| s.chunk.to_context()).collect();
        let (chunks, cut) = crate::rag::within_budget(artifacts, retrieved, rag.budget);
        if found > 0 {
            info!(
                %tenant,
                retrieved = found,
                used = found - cut.ids.len(),
                "retrieved context"
            );
        } else {
            debug!(%tenant, "nothing retrieved for the turn");
        }
        if !cut.ids.is_empty() {
            info!(
                cut_chunks = ?cut.ids,
                cut_chars = cut.chars,
                max_chars = rag.budget.max_chars,
                "context budget reached; retrieved chunks left out"
            );
        }
        chunks
    }

    /// Streams the text of turns that ask for it (`"streaming": true`) to `outlet` as the
    /// model writes it, with progress notes; without an outlet such turns run unstreamed.
    pub fn with_live(mut self, outlet: Arc<dyn LiveOutlet>, settings: LiveSettings) -> Self {
        self.life.live = Some((outlet, settings));
        self
    }

    /// Counts every model call's tokens against its session owner's daily quota.
    pub fn with_quotas(mut self, quotas: crate::tenants::Quotas) -> Self {
        self.life.quotas = quotas;
        self
    }

    /// Says the quotas' limit store lives on the session store's own server (the Redis limits
    /// of a Redis deployment): a model call's usage is then counted by the run's next write, in
    /// the write's own step, where the store can add the counters
    /// ([`crate::store::SessionStore::steps_reach_other_keys`]).
    pub fn with_quotas_on_store(mut self) -> Self {
        self.life.counts_on_store = true;
        self
    }

    /// Counts suppressed duplicates in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.model.metrics = metrics.clone();
        self.life.metrics = metrics;
        self
    }

    /// Runs `step` (the turn's next write) with the tokens of the answer before it counted
    /// against its tenant at the same time: one round trip for both instead of two in a row.
    ///
    /// Joined with `futures_util`'s `join`, which holds `step` once: an `async fn` around
    /// `tokio::join!` held it as its argument and again in the macro's tuple (the settling
    /// step's box was 13,937 bytes for a 6,656-byte step).
    fn counting<'a, T>(
        &'a self,
        spent: crate::tenants::Spent,
        step: impl Future<Output = T> + 'a,
    ) -> impl Future<Output = T> + 'a {
        let spend = async move {
            self.life
                .quotas
                .spend(&spent.tenant, &spent.context, spent.usage)
                .await
        };
        futures_util::FutureExt::map(futures_util::future::join(spend, step), |(_, out)| out)
    }

    /// The context ids this pipeline can run (the front door refuses others).
    pub fn known_contexts(&self) -> KnownContexts {
        self.contexts.as_ref().clone()
    }

    /// Each agent context with its `maxConcurrentCalls` (for the worker's heartbeat).
    pub fn context_capacities(&self) -> Vec<(String, Option<u32>)> {
        self.model.backends.capacities()
    }

    /// Fails a turn for good after its retries ran out (the queue calls this before it
    /// dead-letters the job), so the failure is stored and published like any result; the
    /// stored result instead when the turn already finished.
    pub async fn give_up(
        &self,
        request: &AgentExecuteRequest,
        error: ErrorMessage,
    ) -> Result<Settled, RetryableFailure> {
        self.life.give_up(request, error).await
    }

    /// Fails the turn of a job that cannot be read (see `Lifecycle::fail_unreadable`).
    pub async fn fail_unreadable(
        &self,
        sid: &SessionId,
        tid: &crate::contract::TurnId,
        errors: Vec<ErrorMessage>,
    ) -> Result<Option<Settled>, RetryableFailure> {
        self.life.fail_unreadable(sid, tid, errors).await
    }

    /// The store as the parts outside the pipeline use it (the worker's delivery and
    /// heartbeats): its reads and the writes that are not a turn's state.
    pub fn store(&self) -> Arc<dyn RecordWriter> {
        self.life.records()
    }

    /// Runs one request to its next stable point: a final answer, a client tool continuation,
    /// or a failed turn (all returned as `Ok` and stored). `Err` means "try again later": the
    /// session is busy, or the model, the store or a server tool is unavailable.
    pub async fn run(&self, request: &AgentExecuteRequest) -> Result<TurnResult, RetryableFailure> {
        match self.run_job(request, Origin::default()).await {
            Ok(settled) => Ok(settled.into_result()),
            Err(Interrupted::NotTheTurns(result)) => Ok(*result),
            Err(Interrupted::Busy(f) | Interrupted::Failed(f) | Interrupted::NoCapacity(f)) => {
                Err(f)
            }
        }
    }

    /// Runs a job's turn within `deadline` and says what the worker should do with the job.
    pub async fn execute(&self, request: &AgentExecuteRequest, deadline: Duration) -> JobOutcome {
        self.execute_as(Origin::default(), request, deadline).await
    }

    /// [`Pipeline::execute`] for a job with an [`Origin`]: the tenant the front door marked it
    /// with (the session's owner, whose daily token count the turn's model calls add to) and
    /// the front door waiting for it (which gets the live events directly).
    pub async fn execute_as(
        &self,
        origin: Origin<'_>,
        request: &AgentExecuteRequest,
        deadline: Duration,
    ) -> JobOutcome {
        // Boxed where it is made: the run is the largest state of a turn (~11 KB), and every
        // layer above it (the deadline, the span, the worker's task) would otherwise move it
        // again — tokio copies a task's whole future when it spawns it and when it finishes.
        // Made in its box ([`boxed::boxed`]), not on the stack and copied there.
        let until = tokio::time::Instant::now() + deadline;
        let run = boxed::boxed(|| TURN_DEADLINE.scope(until, self.run_job(request, origin)));
        match tokio::time::timeout_at(until, run).await {
            Ok(Ok(settled)) => JobOutcome::Done(settled),
            Ok(Err(Interrupted::NotTheTurns(result))) => {
                JobOutcome::NotTheTurns(result.errors().into_iter().cloned().collect())
            }
            Ok(Err(Interrupted::Busy(_))) => JobOutcome::Busy,
            Ok(Err(Interrupted::Failed(f))) => JobOutcome::Retry(f.error),
            Ok(Err(Interrupted::NoCapacity(f))) => JobOutcome::NoCapacity(f.error),
            Err(_elapsed) => JobOutcome::Retry(ErrorMessage::new(
                ErrorCode::LlmUnavailable,
                format!(
                    "the turn did not finish within its deadline of {} s",
                    deadline.as_secs()
                ),
            )),
        }
    }

    async fn run_job(
        &self,
        request: &AgentExecuteRequest,
        origin: Origin<'_>,
    ) -> Result<Box<Settled>, Interrupted> {
        let tenant = origin.tenant;
        let span =
            info_span!("turn", session_id = %request.session_id(), turn_id = %request.turn_id());
        async {
            match request {
                AgentExecuteRequest::UserTurn(turn) => {
                    let live = match &self.life.live {
                        Some((outlet, settings)) if turn.streaming() => Some(LiveTurn::start(
                            outlet.clone(),
                            turn.session_id(),
                            turn.turn_id(),
                            origin.reply_to,
                            *settings,
                        )),
                        _ => None,
                    };
                    let print = TurnPrint::of(turn, origin.job);
                    // Boxed as it comes (the job's outcome keeps it in this box): unboxed, the
                    // result was laid out beside the run it came from, 712 bytes more in every
                    // waiting turn.
                    let result = self
                        .run_user_turn(print, tenant, live.clone())
                        .await
                        .map(Box::new);
                    // Every live event is out before the worker publishes the result.
                    if let Some(live) = live {
                        live.finish().await;
                    }
                    result
                }
                AgentExecuteRequest::ToolContinuation(c) => {
                    Box::pin(self.run_continuation(c, tenant, origin.reply_to))
                        .await
                        .map(Box::new)
                }
            }
        }
        .instrument(span)
        .await
    }
}
