//! The turn lifecycle (AGN-027 layer F: persistence is terminal), as `Lifecycle`. The one
//! module that writes a turn's state: inside the pipeline it alone holds the store's writer
//! (the reasoner holds a `Lifecycle` and a reader; the model call and the server tools neither),
//! and in the crate it alone makes the store's [`Grant`], so every other module — the worker,
//! the front door — moves a turn only through the transitions here. A run's turn and session
//! are held in a `Run` whose fields only this module can change.
//!
//! The transitions, each **one atomic store step** (one Lua script on Redis, one lock on the
//! embedded store), checked against the session's lease:
//!
//! | transition | what the step writes |
//! |---|---|
//! | begin (`Lifecycle::begin`) | the lease taken, the run counted (readers see the turn `running`; a new session's contexts latched), read with the turn, the session and any stop request |
//! | start (`Lifecycle::accept_tool_results`; `Lifecycle::start_user_turn` only for a turn whose record was not stored) | the turn `running`, its attempt counted |
//! | checkpoint (`Lifecycle::checkpoint`) | a model answer that calls tools, before any of them runs |
//! | record a tool output (`Lifecycle::record_tool_output`) | the ledger entry and, for `agent_change_mode`, the session's mode and history |
//! | complete / await client tools / fail / cancel | the turn's result and status, the session (conversation head, items, mode), the lease given back |
//! | hand back (`Lifecycle::hand_back`) | after a failure that was not a write: the record as this run last stored it, the lease given back |
//!
//! and at the front door ([`Intake`]): admit a new turn, take back one whose job was not
//! accepted, queue a continuation (and take it back), cancel a waiting turn — each a
//! compare-and-set on the stored record.
//!
//! **A write whose answer is lost is never undone or overwritten.** When a step fails (an
//! error, a broken connection, a timeout), the store holds the turn either as it was before
//! the step or as the step left it — never half of it — and this run cannot tell which. From
//! then on the run writes nothing more of the turn: it gives the lease back by a
//! compare-and-delete on its own fencing token (a no-op when the step had already released
//! it, or when another run holds the lease) and the job runs again; the next run reads what
//! is stored and goes on from there (a stored result is published again, a checkpoint is
//! resumed, a recorded tool output is reused).
//!
//! Where each is: opening a run (`open.rs`), the steps inside it (`steps.rs`), ending it
//! (`settle.rs`), turns no run can finish (`abandon.rs`), the front door's (`intake.rs`); the
//! `Run` and the one write every transition goes through stay here.
//!
//! Owns: the turn's state transitions in the store, the lease, the first shape of a session.
//! Must not: call the model or run tools.

mod abandon;
mod counting;
mod intake;
mod lease;
mod open;
mod settle;
mod steps;

#[cfg(feature = "bench")]
pub mod bench;
pub use intake::Intake;
pub(super) use lease::HeldLease;
pub(crate) use open::Start;

use std::sync::Arc;
use std::time::Duration;

use tracing::info;

use super::outcome::{
    Interrupted, NoLease, PipelineSettings, RetryKind, RetryableFailure, Settled, TurnPrint,
    TurnResult, fingerprint, permanent, store_failure,
};
use crate::catalog::ModeCatalog;
use crate::contract::{ErrorCode, SessionId, SessionMeta, TurnId};
use crate::live::LiveTurn;
use crate::live::{LiveOutlet, LiveSettings};
use crate::metrics::Metrics;
use crate::store::SessionStore;
use crate::store::{ContextIds, Grant, RunWrite, Saved, SessionState, TurnProgress, TurnRecord};

/// Layer F: the turn's state transitions. Within the pipeline the only holder of the store's
/// writer (its field is private to this module): the reasoner (E) moves a turn only by calling
/// these methods, the model call (C) and the server tools (D) hold no writer at all.
#[derive(Clone)]
pub(super) struct Lifecycle {
    store: Arc<dyn SessionStore>,
    /// The mode catalog (a new session's first mode, the answer's mode name).
    pub(super) catalog: Arc<ModeCatalog>,
    /// The pipeline's settings (lease length, worker id).
    pub(super) settings: Arc<PipelineSettings>,
    /// Counts fenced writes, turns and their outcomes.
    pub(super) metrics: Arc<Metrics>,
    /// Where streaming turns' text goes, if anywhere.
    pub(super) live: Option<(Arc<dyn LiveOutlet>, LiveSettings)>,
    /// Tenants' quotas (read at a turn's start).
    pub(super) quotas: crate::tenants::Quotas,
    /// The quotas' limit store lives on the session store's server: a model call's usage is
    /// counted by the run's next write, in its own step, where the store can (see
    /// [`Lifecycle::count_in_write`]).
    pub(super) counts_on_store: bool,
}

impl Lifecycle {
    /// Layer F over `store`.
    pub(super) fn new(
        store: Arc<dyn SessionStore>,
        catalog: Arc<ModeCatalog>,
        settings: Arc<PipelineSettings>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            store,
            catalog,
            settings,
            metrics,
            live: None,
            quotas: crate::tenants::Quotas::default(),
            counts_on_store: false,
        }
    }

    /// The store, for wiring the parts outside the pipeline that write records of their own
    /// (delivery, heartbeats).
    pub(super) fn records(&self) -> Arc<dyn crate::store::RecordWriter> {
        self.store.clone()
    }
}

/// Layer F's grant: the right to call the store's turn-state writes. Nowhere else makes one:
/// `clippy.toml` disallows `Grant::layer_f` everywhere, and this is its one allowed call.
#[allow(clippy::disallowed_methods)]
const GRANT: Grant = Grant::layer_f();

/// How often a running model call looks for a cancel request.
pub(super) const CANCEL_POLL: Duration = Duration::from_millis(500);

/// Everything one run of a turn works on while it holds the session's lease: the turn and the
/// session as this run last stored them (plus what it has not stored yet: the requests it sent,
/// conversation items of the turn), the lease, and its live output. Other layers read it; only
/// this module changes it, in the transitions that write it.
pub(super) struct Run {
    session: SessionState,
    /// Boxed: a run moves through every step of the turn, and the record is its largest part.
    record: Box<TurnRecord>,
    held: HeldLease,
    /// The turn's live output, when its request asked for streaming.
    live: Option<Arc<LiveTurn>>,
    /// Whether the turn had been asked to stop, as the write just before the next model call
    /// read it: that call's safe point takes it instead of asking the store again (one round
    /// trip fewer before the call). Set only where nothing runs between that write and the
    /// call; taken by the call.
    stop_read: Option<bool>,
    /// A write of this run failed: the store holds the turn as it was before that step or as
    /// the step left it, and this run cannot tell which — so it writes nothing more.
    unsure: bool,
    /// See [`Run::take_reattach`].
    reattach: bool,
    /// Whether the record keeps what the model was sent and answered and the server tools'
    /// arguments (for the turn inspector); off for tenants whose `keepBodies` is false.
    keep_bodies: bool,
    /// The run changed the session (a new one, or its owner, contexts or mode key) and has not
    /// written it yet: the next write of the turn carries it.
    session_unsaved: bool,
    /// The store holds no conversation list for the session yet
    /// ([`crate::store::RunWrite::unlisted`]).
    unlisted: bool,
    /// The prompts of requests in the transcript that the next write keeps.
    prompts: Vec<crate::state::Prompt>,
    /// A model call's usage that the next write counts in its own step
    /// ([`Lifecycle::count_in_write`]).
    counts: Option<counting::InWrite>,
    /// The turn's record is stored (the run read it, or one of its writes succeeded): its
    /// writes need not ask whether it is new ([`crate::store::RunWrite::stored`]).
    stored: bool,
}

impl Run {
    fn open(
        session: SessionState,
        record: Box<TurnRecord>,
        held: HeldLease,
        live: Option<Arc<LiveTurn>>,
    ) -> Self {
        Self {
            session,
            record,
            held,
            live,
            stop_read: None,
            unsure: false,
            reattach: false,
            keep_bodies: true,
            session_unsaved: false,
            unlisted: false,
            prompts: Vec::new(),
            counts: None,
            stored: false,
        }
    }

    /// The session as the run sees it.
    pub(super) fn session(&self) -> &SessionState {
        &self.session
    }

    /// The turn as the run sees it.
    pub(super) fn record(&self) -> &TurnRecord {
        &self.record
    }

    /// The turn's live output, if it streams.
    pub(super) fn live(&self) -> Option<&Arc<LiveTurn>> {
        self.live.as_ref()
    }

    /// The lease the run holds.
    #[cfg(test)]
    fn lease(&self) -> &crate::store::Lease {
        self.held.lease()
    }

    /// Whether the turn had been asked to stop, as the last write read it, if nothing has run
    /// since (see [`Run::stop_read`]).
    pub(super) fn take_stop_read(&mut self) -> Option<bool> {
        self.stop_read.take()
    }

    /// `Err` once a write of this run failed (see [`Run::unsure`]): it writes nothing more.
    fn may_write(&self) -> Result<(), RetryableFailure> {
        if self.unsure {
            return Err(store_failure(crate::store::StoreError::Unavailable(
                "an earlier write of this run went unanswered; the run writes nothing more".into(),
            )));
        }
        Ok(())
    }

    /// Whether this run took over from one that died waiting for a background model call
    /// (its live text was not replaced at the start); asked once, by the run's first call.
    pub(super) fn take_reattach(&mut self) -> bool {
        std::mem::take(&mut self.reattach)
    }

    /// Keeps a request sent to the model in the turn's transcript, as the transcript keeps it
    /// (naming its prompt; both stored with the next write), unless the tenant's bodies are
    /// not kept.
    pub(super) fn note_request(&mut self, request: crate::pipeline::compose::Request) {
        if self.keep_bodies {
            self.record.requests.push(request.kept);
            if self.prompts.iter().all(|p| p.id != request.prompt.id) {
                self.prompts.push(request.prompt);
            }
        } else {
            self.record.bodies_withheld = true;
        }
    }

    /// Notes what a model call came to in the turn's record (stored with the next write);
    /// without its text when the tenant's bodies are not kept.
    pub(super) fn note_call(&mut self, mut note: crate::state::CallNote) {
        if !self.keep_bodies {
            note.text = None;
        }
        self.record.calls.push(note);
    }

    /// Notes a server tool call in the turn's record (stored with the next write); without
    /// its arguments when the tenant's bodies are not kept.
    pub(super) fn note_tool(&mut self, mut note: crate::state::ToolNote) {
        if !self.keep_bodies {
            note.arguments.clear();
            note.result = None;
        }
        self.record.tools.push(note);
    }

    /// The model server does not store responses: the session replays its conversation from
    /// now on (stored with the write that settles the turn).
    pub(super) fn switch_to_replay(&mut self) {
        self.session.replay = true;
    }

    /// The turn's progress after a server tool's output was recorded, for its checkpoint
    /// (stored with the next write; a resumed run finds the output in the ledger either way).
    pub(super) fn note_progress(&mut self, progress: &TurnProgress) {
        if let Some(cp) = self.record.checkpoint.as_mut() {
            cp.progress = progress.clone();
        }
    }
}

impl Lifecycle {
    /// The session part of a turn's answer.
    pub(super) fn meta(&self, session: &SessionState, turn_id: &TurnId) -> SessionMeta {
        SessionMeta {
            session_id: session.session_id.clone(),
            turn_id: turn_id.clone(),
            mode_display_name: self
                .catalog
                .by_id_or_default(&session.mode_id)
                .display_name
                .clone(),
        }
    }

    /// The one write of a run's turn (and, with `with_session` or a session the run changed
    /// and has not written, its session) through
    /// [`SessionStore::save`](crate::store::SessionStore::save); with `release`, the lease is
    /// given back in the same step. A failure marks the run unsure (see [`Run::unsure`]).
    async fn write(
        &self,
        run: &mut Run,
        with_session: bool,
        release: bool,
    ) -> Result<Saved, RetryableFailure> {
        let counts = run.counts.take();
        if let Err(f) = run.may_write() {
            self.count_unwritten(counts).await;
            return Err(f);
        }
        let with_session = with_session || run.session_unsaved;
        let session = with_session.then_some(&run.session);
        // The prompts the transcript names go beside the write (a store writes each only now
        // and then, so mostly without a round trip). One not kept costs the inspector a
        // request's instructions and tools, not the turn.
        let prompts = std::mem::take(&mut run.prompts);
        let keep = async {
            for prompt in &prompts {
                if let Err(e) = self.store.keep_prompt(prompt).await {
                    tracing::warn!(prompt = %prompt.id, error = %e, "could not keep a call's prompt; the turn's inspector will show its requests without instructions and tools");
                }
            }
        };
        let write = RunWrite {
            session,
            turn: &run.record,
            lease: run.held.lease(),
            release,
            stored: run.stored,
            unlisted: run.unlisted,
            counts: counts.as_ref().map(|c| &c.adds),
        };
        match tokio::join!(keep, self.store.save_run(&GRANT, write)).1 {
            Ok(saved) => {
                if saved.counts_missed {
                    self.counts_missed(counts.as_ref());
                }
                run.stored = true;
                if with_session {
                    // The store holds them now (listed, or with the session by a write that
                    // gave the lease back: the run writes nothing more).
                    run.session.conversation.clear();
                    run.session_unsaved = false;
                    run.unlisted = false;
                }
                if release {
                    run.held.released_by_store();
                }
                Ok(saved)
            }
            Err(e) => {
                run.unsure = true;
                self.count_after_failed_write(counts, &e).await;
                Err(store_failure(e))
            }
        }
    }
}

/// Why a run cannot have the session now: another run holds its lease.
pub(super) fn busy(sid: &SessionId) -> NoLease {
    info!("session is busy with another turn");
    NoLease::Busy(RetryableFailure {
        error: permanent(
            ErrorCode::SessionBusy,
            format!(
                "session {} is running another turn; this one will run after it",
                sid.client_id()
            ),
        ),
        kind: RetryKind::Failure,
    })
}

/// What a user turn's run starts from ([`Lifecycle::begin`]).
pub(super) struct Begin {
    /// The turn as stored (boxed as the store read it; the run keeps the box).
    pub(super) turn: Option<Box<TurnRecord>>,
    /// The session's lease, renewed; `None` when the session is busy.
    pub(super) held: Option<HeldLease>,
    /// The session as stored (read only with the lease).
    pub(super) session: Option<SessionState>,
    /// A new session's contexts, latched by the begin step.
    pub(super) latched: Option<ContextIds>,
    /// With the lease: the runs of the turn begun, this one included.
    pub(super) runs: u32,
    /// With the lease: whether the turn had been asked to stop.
    pub(super) stop_requested: bool,
    /// With the lease, when the begin step was given a key to probe and the store reads it
    /// in the step: whether that key exists.
    pub(super) probed: Option<bool>,
}

#[cfg(test)]
mod tests;
