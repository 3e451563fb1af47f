//! Opening a run: the lease taken, the turn and session read (a new session's first shape),
//! a user turn started or a continuation's tool results accepted.

use std::sync::Arc;

use tracing::warn;

use super::{
    Interrupted, Lifecycle, NoLease, RetryableFailure, Settled, TurnResult, store_failure,
};
use crate::contract::{SessionId, TurnId};
use crate::live::LiveTurn;
use crate::store::{ContextIds, Lease, SessionState, TurnRecord, TurnStatus, now_rfc3339};

use super::*;

impl Lifecycle {
    /// Takes the session's lease (one turn at a time per session) and keeps it renewed.
    pub(crate) async fn lease(&self, sid: &SessionId, tid: &TurnId) -> Result<HeldLease, NoLease> {
        let holder = self.holder(tid);
        match self
            .store
            .acquire_lease(&GRANT, sid, &holder, self.settings.lease_ttl)
            .await
            .map_err(|e| NoLease::Failed(store_failure(e)))?
        {
            Some(lease) => self
                .replicated(sid, self.hold(sid, lease))
                .await
                .map_err(NoLease::Failed),
            None => Err(busy(sid)),
        }
    }

    /// `held`, once its fencing token is on as many replicas as the deployment requires
    /// ([`SessionStore::confirm_replicated`](crate::store::SessionStore::confirm_replicated));
    /// else given back.
    pub(super) async fn replicated(
        &self,
        sid: &SessionId,
        held: HeldLease,
    ) -> Result<HeldLease, RetryableFailure> {
        match self.store.confirm_replicated(sid).await {
            Ok(()) => Ok(held),
            Err(e) => {
                held.release().await;
                Err(store_failure(e))
            }
        }
    }

    /// The start of a user turn's run: the session's lease, taken with the turn and the
    /// session read under it in one store step (see
    /// [`SessionStore::begin_turn`](crate::store::SessionStore::begin_turn)). The turn
    /// comes back even when the session is busy, for a duplicate job's stored result. A new
    /// session latches `contexts` in the same step. With `probe` (see
    /// [`Lifecycle::steps_reach_other_keys`]), the step also says whether that key exists.
    pub(crate) async fn begin(
        &self,
        sid: &SessionId,
        tid: &TurnId,
        contexts: Option<&ContextIds>,
        probe: Option<&str>,
    ) -> Result<Begin, Interrupted> {
        let (holder, ttl) = (self.holder(tid), self.settings.lease_ttl);
        let begun = (self.store)
            .begin_turn(&GRANT, sid, tid, &holder, ttl, contexts, probe)
            .await
            .map_err(store_failure)?;
        let held = match begun.lease {
            Some(lease) => Some(self.replicated(sid, self.hold(sid, lease)).await?),
            None => None,
        };
        Ok(Begin {
            turn: begun.turn,
            held,
            session: begun.session,
            latched: begun.latched,
            runs: begun.runs,
            stop_requested: begun.stop_requested,
            probed: begun.probed,
        })
    }

    /// Whether the run's steps reach other keys of the store's server: the begin step can
    /// look for one, a write can add to counters
    /// ([`crate::store::SessionStore::steps_reach_other_keys`]).
    pub(crate) fn steps_reach_other_keys(&self) -> bool {
        self.store.steps_reach_other_keys()
    }

    /// Who takes a lease: this worker, the turn, and this taking of it. The last part makes
    /// every lease value unique, so a run is fenced out by its own lease value, not only by its
    /// token: a failover that loses the latest fencing token (and the lease) cannot give a
    /// later run of the same turn on this worker the very value an earlier run still writes
    /// with.
    pub(super) fn holder(&self, tid: &TurnId) -> String {
        format!(
            "{}/{tid}/{}",
            self.settings.worker_id,
            uuid::Uuid::new_v4().simple()
        )
    }

    /// Keeps `lease` renewed in the background until the run gives it back.
    pub(super) fn hold(&self, sid: &SessionId, lease: Lease) -> HeldLease {
        let ttl = self.settings.lease_ttl;
        let store = self.store.clone();
        let (sid2, lease2) = (sid.clone(), lease.clone());
        let renewer = tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                match store.renew_lease(&GRANT, &sid2, &lease2, ttl).await {
                    Ok(true) => {}
                    Ok(false) => {
                        warn!(session_id = %sid2, "session lease lost; further writes of this turn will be rejected");
                        return;
                    }
                    Err(e) => {
                        warn!(session_id = %sid2, error = %e, "could not renew the session lease")
                    }
                }
            }
        });
        HeldLease {
            lease,
            session: sid.clone(),
            store: self.store.clone(),
            renewer,
            given_back: false,
        }
    }

    pub(crate) fn new_session(&self, sid: &SessionId) -> SessionState {
        let mode = self.catalog.default_mode();
        let now = now_rfc3339();
        SessionState {
            session_id: sid.clone(),
            mode_id: mode.id.clone(),
            mode_key: mode.key.clone(),
            mode_history: Vec::new(),
            previous_response_id: None,
            conversation: Vec::new(),
            replay: false,
            previous_call: None,
            solution_context: None,
            contexts: Default::default(),
            owner: None,
            created_at: now.clone(),
            updated_at: now,
        }
    }

    /// Starts a run of a user turn: the turn (the stored record, or a new one) becomes
    /// `running` in the attempt the begin step counted. Nothing is written when the record is
    /// stored: the begin step counted the run (readers see it `running`) and read whether it
    /// was asked to stop, which a fresh run's first model call takes as its safe point; the
    /// record, with its `run_started` event, and a session the run changed (`changed`) go
    /// with the run's next write. A record the front door's write lost is written now (a
    /// failed write hands the turn back).
    pub(crate) async fn start_user_turn(
        &self,
        held: HeldLease,
        mut record: Box<TurnRecord>,
        session: SessionState,
        start: Start,
        live: Option<Arc<LiveTurn>>,
    ) -> Result<Run, RetryableFailure> {
        record.status = TurnStatus::Running;
        record.mode_key = session.mode_key.clone();
        record.attempts = attempt(&record, start.runs);
        // A run that died waiting for a background call: this one re-attaches to it and its
        // text goes on where the client's stopped (the call says otherwise if it cannot).
        let reattach = record.model_call.is_some() && record.attempts > 1;
        record.note_event(
            "run_started",
            reattach.then(|| "it follows the background model call an earlier run made".into()),
        );
        if let Some(live) = &live {
            if reattach {
                live.resume(record.attempts);
            } else {
                live.rerun(record.attempts);
            }
        }
        let mut run = Run::open(session, record, held, live);
        run.reattach = reattach;
        run.keep_bodies = self.keeps_bodies(&run.session);
        run.session_unsaved = start.changed;
        run.unlisted = start.new_session;
        run.stored = start.stored;
        if start.stored {
            if run.record.checkpoint.is_none() {
                run.stop_read = Some(start.stop_requested);
            }
            return Ok(run);
        }
        match self.write(&mut run, false, false).await {
            Ok(saved) => {
                if run.record.checkpoint.is_none() {
                    run.stop_read = Some(saved.stop_requested);
                }
                Ok(run)
            }
            Err(f) => Err(self.hand_back(run, f).await),
        }
    }

    /// Fails a user turn at the start of a run (its contexts cannot run), as an attempt.
    pub(crate) async fn fail_at_start(
        &self,
        held: HeldLease,
        mut record: Box<TurnRecord>,
        session: SessionState,
        live: Option<Arc<LiveTurn>>,
        result: TurnResult,
        runs: u32,
    ) -> Result<Settled, RetryableFailure> {
        record.attempts = attempt(&record, runs);
        self.fail_turn(Run::open(session, record, held, live), result)
            .await
    }

    /// A run of a continuation for a turn waiting for client tools (nothing written yet): the
    /// turn `running` with its attempt counted, the session's owner and mode key as the run
    /// sees them. Next: [`Pipeline::accept_tool_results`], or a failure.
    pub(crate) fn open_continuation(
        &self,
        held: HeldLease,
        mut record: TurnRecord,
        mut session: SessionState,
        tenant: Option<&str>,
        live: Option<Arc<LiveTurn>>,
    ) -> Run {
        // Still running: a run of this continuation died, and this one replaces its text.
        let again = record.status == TurnStatus::Running;
        record.status = TurnStatus::Running;
        record.attempts += 1;
        record.note_event("run_started", Some("with the client's tool results".into()));
        if let Some(live) = &live {
            if again {
                live.rerun(record.attempts);
            } else {
                live.resume(record.attempts);
            }
        }
        if let Some(t) = tenant {
            session.owner = Some(t.to_string());
        }
        session.mode_key = self.catalog.by_id_or_default(&session.mode_id).key.clone();
        let mut run = Run::open(session, Box::new(record), held, live);
        run.keep_bodies = self.keeps_bodies(&run.session);
        // A continuation is accepted only for a turn stored waiting for its tools.
        run.stored = true;
        run
    }

    /// Whether turns of the session's owner keep their bodies in the record.
    pub(super) fn keeps_bodies(&self, session: &SessionState) -> bool {
        session
            .owner
            .as_deref()
            .is_none_or(|t| self.quotas.tenants().keeps_bodies(t))
    }

    /// Records that the client's results for these calls were accepted, with the turn
    /// `running`. Returns whether the turn had been asked to stop, read in the same step.
    pub(crate) async fn accept_tool_results(
        &self,
        run: &mut Run,
        submitted: Vec<String>,
    ) -> Result<bool, RetryableFailure> {
        run.record.answered.extend(submitted);
        let saved = self.write(run, false, false).await?;
        run.stop_read = Some(saved.stop_requested);
        Ok(saved.stop_requested)
    }

    /// The session's lease and, under it, the turn as stored (a run outside a job's normal
    /// path: giving a turn up, failing an unreadable job's turn).
    pub(super) async fn lease_and_read(
        &self,
        sid: &SessionId,
        tid: &TurnId,
    ) -> Result<(HeldLease, Option<TurnRecord>), RetryableFailure> {
        let held = self
            .lease(sid, tid)
            .await
            .map_err(NoLease::into_retryable)?;
        match self.store.get_turn(sid, tid).await {
            Ok(record) => Ok((held, record)),
            Err(e) => {
                held.release().await;
                Err(store_failure(e))
            }
        }
    }
}

/// How a user turn's run starts ([`Lifecycle::start_user_turn`]), from its begin step.
pub(crate) struct Start {
    /// The session is new, or the run changed it (owner, contexts, mode key, solution
    /// context): the run's next write carries it.
    pub(crate) changed: bool,
    /// The session was not stored when the run began ([`crate::store::RunWrite::unlisted`]).
    pub(crate) new_session: bool,
    /// The turn's record is stored (the front door wrote it); otherwise the run writes it.
    pub(crate) stored: bool,
    /// The runs of the turn begun, this one included ([`Begin::runs`]).
    pub(crate) runs: u32,
    /// Whether the turn had been asked to stop when the run began.
    pub(crate) stop_requested: bool,
}

/// The attempt a run of `record` is: the count of runs begun, or one more than the record
/// says when that is more (runs counted in the record alone: a continuation's, or a record
/// written before runs were counted at their beginning).
fn attempt(record: &TurnRecord, runs: u32) -> u32 {
    runs.max(record.attempts + 1)
}
