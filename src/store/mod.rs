//! Persistence of session and turn state: the storage under AGN-027 layer F
//! ([`crate::pipeline::lifecycle`], the one module that decides a turn's transitions and holds
//! the [`Grant`] every turn-state write takes). Each write is one atomic step. The shapes
//! themselves live in [`crate::state`] (re-exported here).
//!
//! Owns: the [`SessionStore`] trait, its two implementations ([`memory`], [`redis`]) and
//! retention. Must not: call the model or run tools, or decide a turn's transitions. Workers are stateless: everything a turn
//! needs to resume (pending client tool calls, recorded server tool outputs) is stored here.

pub mod memory;
pub mod redis;
mod run_write;
mod runs;

use std::time::Duration;

use serde_json::Value;

use crate::contract::{SessionId, TurnId};

pub use crate::state::{
    BatchItem, BatchLineError, BatchRecord, Checkpoint, ContextIds, Lease, ModeChange,
    PendingTools, Prompt, SessionState, TurnProgress, TurnRecord, TurnStatus, TurnStatusView,
    now_rfc3339,
};
pub use memory::MemoryStore;
pub use redis::RedisStore;
pub use run_write::{CounterAdd, CounterAdds, RunWrite};
pub use runs::{IndexedTurn, RunsPage, RunsPosition, now_ms};

/// The right to write a turn's state: every store method that moves a turn (admits, creates,
/// takes back or replaces its record, takes, renews or gives back the session's lease, saves
/// the turn and its session, records a server tool's output) takes one.
///
/// AGN-027 layer F ([`crate::pipeline::lifecycle`]) is the one place that makes a grant: the
/// pipeline's other layers and the front door do not even hold a [`SessionStore`], and clippy
/// (`clippy.toml`, `disallowed-methods`) refuses a call of `Grant::layer_f` anywhere but F's
/// one allowed call, so whoever holds a store still moves a turn only through F's transitions.
/// Integration tests of the stores themselves get one from `Grant::for_tests` (feature
/// `test-support`).
#[derive(Debug)]
pub struct Grant(());

impl Grant {
    /// Layer F's grant. Called in `src/pipeline/lifecycle/` only (clippy refuses it elsewhere).
    pub(crate) const fn layer_f() -> Self {
        Self(())
    }

    /// A grant for tests that exercise a store directly (the conformance suite).
    #[cfg(any(test, feature = "test-support"))]
    pub const fn for_tests() -> Self {
        Self(())
    }
}

/// Retention of stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Turn records and their results expire this long after their last write.
    pub turns: Duration,
    /// Sessions expire this long after their last write (idle sessions).
    pub sessions: Duration,
}

impl Retention {
    /// How long a session's turns index, and what was latched for the session (its contexts,
    /// the owner of a bare id, its fencing counter), are kept after a turn is added: the
    /// longer of the two, so that a turn admitted to a session stays listed, and runs under
    /// the contexts it was admitted with, at least until it could have settled, even where
    /// sessions are kept for less time than a turn waits and runs.
    pub fn turns_index(&self) -> Duration {
        self.sessions.max(self.turns)
    }
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            turns: Duration::from_secs(7 * 24 * 3600),
            sessions: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// A store operation that could not be done.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend is unreachable or failed; the operation may succeed if retried.
    #[error("session store unavailable: {0}")]
    Unavailable(String),
    /// Redis failed or did not answer in time; the operation may succeed if retried. The
    /// client's error is kept (its kind: timeout, refused, I/O, a script error) and written
    /// into the message, not returned as the source.
    #[error("session store unavailable: {0}")]
    Redis(::redis::RedisError),
    /// Stored data is not what the store wrote (a record missing that must exist, a value out
    /// of place).
    #[error("session store data is corrupt: {0}")]
    Corrupt(String),
    /// A stored value could not be decoded.
    #[error("session store data under {key} cannot be decoded: {error}")]
    Decode {
        /// The key whose value failed to decode.
        key: String,
        /// The decoder's error (written into the message).
        error: serde_json::Error,
    },
    /// A value could not be encoded for storing.
    #[error("a value cannot be encoded for the session store: {0}")]
    Encode(serde_json::Error),
    /// The writer no longer holds the session's lease; its write was rejected.
    #[error("the lease on session {0} was lost; the write was rejected")]
    Fenced(String),
    /// Fewer replicas than `APTIX_REDIS_MIN_REPLICAS` acknowledged the session's writes in
    /// time: they are on the primary, and a failover now could lose them, so they do not count
    /// yet (the turn runs again later and finds what is stored).
    #[error(
        "session {session}'s writes reached {acked} of the {wanted} replicas required within {} ms",
        waited.as_millis()
    )]
    NotReplicated {
        /// The session.
        session: String,
        /// `APTIX_REDIS_MIN_REPLICAS`.
        wanted: u32,
        /// Replicas that acknowledged.
        acked: u32,
        /// How long the store waited.
        waited: Duration,
    },
}

/// Live events kept per turn ([`RecordWriter::keep_live`]).
pub const LIVE_EVENTS_PER_TURN: usize = 512;
/// How long a turn's live events are kept after its latest.
pub const LIVE_KEPT: Duration = Duration::from_secs(30);

/// One server tool's output for the turn's ledger ([`SessionStore::record_tool_output`]), with
/// the session the tool changed, if it did.
#[derive(Debug, Clone, Copy)]
pub struct ToolOutput<'a> {
    /// The model's `call_id` of the tool call.
    pub call_id: &'a str,
    /// What the tool answered the model.
    pub output: &'a str,
    /// The session as the run holds it with the tool's change applied (`agent_change_mode`:
    /// the new mode and its history entry), written whole; its conversation items, if any,
    /// are appended to the stored conversation.
    pub session: Option<&'a SessionState>,
}

/// What [`SessionStore::begin_turn`] found.
#[derive(Debug)]
pub struct Begun {
    /// The turn as stored, boxed as read (the run keeps the box; ~1.5 KB not held by value).
    pub turn: Option<Box<TurnRecord>>,
    /// The session's lease; `None` when another holder has it (the session is busy).
    pub lease: Option<Lease>,
    /// The session as stored (`None` for a new session, and when the lease was not taken).
    pub session: Option<SessionState>,
    /// For a new session (the lease taken, no session stored) when contexts to latch were
    /// given: the session's latched contexts — those, unless it had latched others.
    pub latched: Option<ContextIds>,
    /// With the lease: the runs of the turn begun, this one included (the count the step
    /// keeps in the turn's ledger, [`crate::state::RUNS_BEGUN`]); 0 without it.
    pub runs: u32,
    /// With the lease: whether the turn had been asked to stop.
    pub stop_requested: bool,
    /// With the lease, when the begin step was given a key to probe and the store reaches it
    /// ([`SessionStore::steps_reach_other_keys`]): whether that key exists. `None` otherwise.
    pub probed: Option<bool>,
}

/// What [`SessionStore::save`] read in its step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saved {
    /// The turn had been asked to stop when it was written (read only by a write that keeps
    /// the lease: one that gives it back ends the run).
    pub stop_requested: bool,
    /// Someone may be watching the session: it was marked ([`RecordWriter::mark_watched`])
    /// when the turn was written.
    pub watched: bool,
    /// Counters the write was to add to ([`RunWrite::counts`]) were not all added: the store
    /// cannot add them in its step, or one is not a counter.
    pub counts_missed: bool,
}

/// Whether a runs index note was written ([`RecordWriter::index_turn`]): its note is handed in
/// already.
pub type Noting = std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

/// Who notes an admitted turn in the runs index ([`SessionStore::admit_and_index`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunsNote {
    /// The admission noted it (a turn it recorded or found; nothing for one it refused).
    Noted,
    /// The admission did not: the caller notes the turn if it accepts it.
    Yours,
    /// The admission tried and the note failed (why): the turn is admitted all the same.
    Missed(String),
}

/// What [`SessionStore::admit_turn`] found, and how far it went.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Another tenant owns the session: nothing was written.
    OtherOwner,
    /// The session runs with these contexts, not the ones given: the turn was not recorded
    /// (whether it may run with them is the caller's call).
    OtherContexts(ContextIds),
    /// The turn's record: `None` when this call created it, else the one that was there.
    Turn(Option<Box<TurnRecord>>),
}

/// What a store answers without changing anything: sessions, turns, the conversation, cancel
/// requests, live events, batches and heartbeats. Everything that only reads state holds this
/// (the model call, the routes that read); only the turn's lifecycle and the parts that write
/// non-turn state hold a [`SessionStore`].
#[async_trait::async_trait]
pub trait StoreReader: Send + Sync + 'static {
    /// The session, if it exists.
    async fn get_session(&self, id: &SessionId) -> Result<Option<SessionState>, StoreError>;
    /// The turn, if it exists in that session.
    async fn get_turn(
        &self,
        session: &SessionId,
        turn: &TurnId,
    ) -> Result<Option<TurnRecord>, StoreError>;
    /// The session's turn ids with their status, oldest first.
    async fn list_turns(&self, session: &SessionId) -> Result<Vec<TurnId>, StoreError>;
    /// The tenant claimed for the session, if any: only a bare id's is claimed (the local
    /// tenant's, or another's from before ids were scoped); a scoped id names its tenant
    /// ([`SessionId::tenant`]) and has none stored.
    async fn owner(&self, session: &SessionId) -> Result<Option<String>, StoreError>;
    /// Whether the turn was asked to stop.
    async fn cancel_requested(
        &self,
        session: &SessionId,
        turn: &TurnId,
    ) -> Result<bool, StoreError>;
    /// For each turn, whether it was asked to stop: [`StoreReader::cancel_requested`] for many
    /// turns at once (the worker's watch over its turns in a model call), in as few requests
    /// as the store can.
    async fn cancels_requested(
        &self,
        turns: &[(SessionId, TurnId)],
    ) -> Result<Vec<bool>, StoreError> {
        let mut asked = Vec::with_capacity(turns.len());
        for (session, turn) in turns {
            asked.push(self.cancel_requested(session, turn).await?);
        }
        Ok(asked)
    }
    /// The contexts the session latched, if any.
    async fn latched_contexts(&self, session: &SessionId)
    -> Result<Option<ContextIds>, StoreError>;
    /// The session's conversation list, oldest item first (empty for an unknown session); the
    /// items a session read back holds follow it ([`SessionState::conversation`]).
    async fn conversation(&self, session: &SessionId) -> Result<Vec<Value>, StoreError>;
    /// The live events kept of a turn ([`RecordWriter::keep_live`]), oldest first.
    async fn kept_live(
        &self,
        session: &SessionId,
        turn: &TurnId,
    ) -> Result<Vec<Vec<u8>>, StoreError>;
    /// How many writes were rejected because their lease was stale.
    fn fenced_rejections(&self) -> u64;
    /// The batch, if it exists.
    async fn get_batch(&self, id: &str) -> Result<Option<BatchRecord>, StoreError>;
    /// The ids of `tenant`'s latest batches, newest first, at most `max` (some may have
    /// expired since).
    async fn list_batches(&self, tenant: &str, max: usize) -> Result<Vec<String>, StoreError>;
    /// `tenant`'s turns in the runs index ([`RecordWriter::index_turn`]), newest first: the
    /// entries `page` admits, at most `page.max` of them. Entries older than the turn
    /// retention may be gone; an entry's record may be gone too.
    async fn recent_turns(
        &self,
        tenant: &str,
        page: &RunsPage,
    ) -> Result<Vec<IndexedTurn>, StoreError>;
    /// Every heartbeat held, by worker, however old.
    async fn heartbeats(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
    /// The prompts kept under these ids ([`RecordWriter::keep_prompt`]), by id; one kept no
    /// longer is absent.
    async fn prompts(
        &self,
        ids: &[String],
    ) -> Result<std::collections::BTreeMap<String, String>, StoreError>;
    /// Several turns at once, in the order asked (`None` where absent); one round trip where
    /// the backend allows it.
    async fn get_turns(
        &self,
        ids: &[(SessionId, TurnId)],
    ) -> Result<Vec<Option<TurnRecord>>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for (sid, tid) in ids {
            out.push(self.get_turn(sid, tid).await?);
        }
        Ok(out)
    }
}

/// Session and turn persistence: the reads of [`StoreReader`] and the writes. Implementations:
/// [`MemoryStore`] (embedded, tests) and [`RedisStore`]; both pass one conformance suite
/// (`tests/it/store_conformance.rs`).
///
/// Every write a worker makes during a turn carries its [`Lease`] and is rejected if that lease
/// is no longer the session's current one; the turn-state writes take layer F's [`Grant`].
/// The store's writes that are not a turn's state: a session's owner and latched contexts,
/// cancel requests, watch marks, kept live events, batches and their completion, heartbeats,
/// and the wait for replicas. The front door, its handlers, the delivery owner and the worker's
/// vitals hold this, not a [`SessionStore`]: they cannot write a turn.
#[async_trait::async_trait]
pub trait RecordWriter: StoreReader {
    /// Makes `tenant` the session's owner unless it has one; returns the owner.
    async fn claim_owner(&self, session: &SessionId, tenant: &str) -> Result<String, StoreError>;
    /// Latches `contexts` as the session's unless it has latched some already; returns the
    /// latched ones (and keeps them as long as the session). Not fenced: the front door
    /// latches when it accepts a session's first turn.
    async fn latch_contexts(
        &self,
        session: &SessionId,
        contexts: &ContextIds,
    ) -> Result<ContextIds, StoreError>;
    /// Asks whoever runs the turn to stop it at its next safe point (kept as long as turn
    /// records). Not fenced: the front door asks without holding the lease.
    async fn request_cancel(&self, session: &SessionId, turn: &TurnId) -> Result<(), StoreError>;
    /// Returns once everything stored for `session` so far is held by as many replicas as the
    /// deployment requires (`APTIX_REDIS_MIN_REPLICAS`), else [`StoreError::NotReplicated`]:
    /// called after a turn settles (before its status is published and its job acknowledged)
    /// and after a lease is taken (a new fencing token). Stores without replicas have nothing
    /// to wait for.
    async fn confirm_replicated(&self, _session: &SessionId) -> Result<(), StoreError> {
        Ok(())
    }
    /// Marks the session as watched for at least `ttl` from now (a mark that lasts longer is
    /// left as it is). A worker sends a session's statuses to the session's watchers and to
    /// its on-subscribe reply queue only while the session is marked ([`Saved::watched`]), so
    /// whoever subscribes marks the session first and again while it stays (see
    /// [`crate::delivery::WatchMark`]): a turn saved before the mark is found by the store
    /// read that follows the subscription, one saved after it is sent.
    async fn mark_watched(&self, session: &SessionId, ttl: Duration) -> Result<(), StoreError>;
    /// Keeps one live event of a streaming turn (its JSON, [`crate::live::LiveEvent`]) for
    /// [`LIVE_KEPT`] after the turn's latest, the newest [`LIVE_EVENTS_PER_TURN`] of each
    /// turn: a client that reconnects to any front door with `Last-Event-ID` gets the text it
    /// missed from here. Not turn state: an event not kept costs such a client some text.
    async fn keep_live(
        &self,
        session: &SessionId,
        turn: &TurnId,
        event: &[u8],
    ) -> Result<(), StoreError>;
    /// Keeps a call's prompt (its instructions and tools, by its id) at least as long as any
    /// turn record whose transcript names it: turn records name prompts rather than carry
    /// them. Cheap to call for every call: a store writes each prompt only now and then.
    async fn keep_prompt(&self, prompt: &Prompt) -> Result<(), StoreError>;
    /// Notes an accepted turn in its session's tenant's runs index
    /// ([`StoreReader::recent_turns`]), kept as long as turn records; a turn noted again keeps
    /// its first time. Not turn state: a note lost costs only its line in the lists. The call
    /// hands the note in; the future answers whether it was written, so a caller can do other
    /// work (the enqueue) before it asks, and a store may write notes handed in meanwhile
    /// together.
    fn index_turn(&self, entry: IndexedTurn) -> Noting;
    /// Stores a batch (kept as long as turn records).
    async fn put_batch(&self, batch: &BatchRecord) -> Result<(), StoreError>;
    /// Writes worker `worker`'s heartbeat (see [`crate::vitals`]), over its last one.
    async fn put_heartbeat(&self, worker: &str, body: &[u8]) -> Result<(), StoreError>;
    /// Removes worker `worker`'s heartbeat (it stopped, or it is long gone).
    async fn drop_heartbeat(&self, worker: &str) -> Result<(), StoreError>;
    /// Notes what is known of batch `id`'s completion, atomically: a line's turn that settled
    /// (each counted once, however often it settles) and, from the front door once every line
    /// was enqueued, how many lines have turns. `true` when every line has settled and the
    /// batch is not marked done ([`RecordWriter::batch_done`]) — whoever notes the last piece
    /// tells of it.
    async fn note_batch(
        &self,
        id: &str,
        settled: Option<(&SessionId, &TurnId)>,
        lines: Option<usize>,
    ) -> Result<bool, StoreError>;
    /// Marks batch `id` as told of (after its `batch.completed` deliveries were enqueued).
    async fn batch_done(&self, id: &str) -> Result<(), StoreError>;
    /// Notes, before they are enqueued, that the turn event of batch `id`'s line `line` goes
    /// to `urls`: the line counts towards the batch's completion only once each of them is
    /// finished ([`RecordWriter::line_event_finished`]), so `batch.completed` never overtakes
    /// a line's event. Kept for the turn retention.
    async fn expect_line_events(
        &self,
        id: &str,
        line: (&SessionId, &TurnId),
        urls: &[&str],
    ) -> Result<(), StoreError>;
    /// Notes that the event of batch `id`'s line `line` to `url` was delivered or given up on;
    /// `true` when none of the line's events is left (also when none was expected).
    async fn line_event_finished(
        &self,
        id: &str,
        line: (&SessionId, &TurnId),
        url: &str,
    ) -> Result<bool, StoreError>;
}

#[async_trait::async_trait]
pub trait SessionStore: RecordWriter {
    /// Creates the record of a newly accepted turn unless one exists; returns the existing one
    /// otherwise. Not fenced: the front door writes it without holding the session's lease.
    async fn create_turn(
        &self,
        grant: &Grant,
        turn: &TurnRecord,
    ) -> Result<Option<TurnRecord>, StoreError>;
    /// Admits a new user turn in one step: claims the session for `owner` (when given) unless
    /// it has an owner, latches `contexts` unless the session latched some, and creates `turn`
    /// as [`SessionStore::create_turn`] does — stopping, with nothing more written, at an owner
    /// that is not `owner` or at latched contexts that are not `contexts`. Not fenced.
    async fn admit_turn(
        &self,
        grant: &Grant,
        owner: Option<&str>,
        contexts: &ContextIds,
        turn: &TurnRecord,
    ) -> Result<Admission, StoreError> {
        let session = &turn.session_id;
        if let Some(tenant) = owner
            && self.claim_owner(session, tenant).await? != tenant
        {
            return Ok(Admission::OtherOwner);
        }
        let latched = self.latch_contexts(session, contexts).await?;
        if &latched != contexts {
            return Ok(Admission::OtherContexts(latched));
        }
        Ok(Admission::Turn(
            self.create_turn(grant, turn).await?.map(Box::new),
        ))
    }
    /// [`SessionStore::admit_turn`], and a turn it records or finds noted in its tenant's
    /// runs index as accepted at `accepted_ms` ([`IndexedTurn::of`], as
    /// [`RecordWriter::index_turn`] notes it) in the same step where the store can:
    /// [`RunsNote::Noted`]. A store that cannot answers [`RunsNote::Yours`] and notes nothing:
    /// the caller notes it (beside its enqueue).
    async fn admit_and_index(
        &self,
        grant: &Grant,
        owner: Option<&str>,
        contexts: &ContextIds,
        turn: &TurnRecord,
        accepted_ms: i64,
    ) -> Result<(Admission, RunsNote), StoreError> {
        let _ = accepted_ms;
        let admission = self.admit_turn(grant, owner, contexts, turn).await?;
        Ok((admission, RunsNote::Yours))
    }
    /// Deletes a turn record that is still exactly as [`SessionStore::create_turn`] wrote it
    /// and that no run has begun (its job was never confirmed, so nothing should run it);
    /// `false` when it changed, is gone or a run began. When that leaves the session with no turn and no state (it never ran), the
    /// contexts its admission latched are let go in the same step (the owner it claimed stays:
    /// a job accepted after all runs as that tenant's). Not fenced, like `create_turn`.
    async fn discard_turn(&self, grant: &Grant, turn: &TurnRecord) -> Result<bool, StoreError>;
    /// Replaces a turn record only if it is still exactly `current` (compare-and-set), with
    /// as many runs begun as when it was read ([`TurnRecord::runs_begun`]); `false` when it
    /// changed, is gone or a run began since, and nothing was written. Not fenced: the front door uses it
    /// to move a turn that waits for client tools back to `queued` when it accepts their
    /// results, and to undo that when the job was not accepted.
    async fn replace_turn(
        &self,
        grant: &Grant,
        current: &TurnRecord,
        new: &TurnRecord,
    ) -> Result<bool, StoreError>;
    /// Takes the session's lease for `ttl`; `None` when another holder has it (session busy).
    async fn acquire_lease(
        &self,
        grant: &Grant,
        session: &SessionId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError>;
    /// Extends a held lease; `false` when it was lost (expired and maybe taken by another).
    async fn renew_lease(
        &self,
        grant: &Grant,
        session: &SessionId,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<bool, StoreError>;
    /// The start of a run of a user turn: takes the session's lease for `ttl` and reads the
    /// turn and, with the lease, the session — the reads see everything written before the
    /// lease was taken, so nothing can settle the turn between them and the run. The turn is
    /// read even when another holder has the lease: a stored result may be all a duplicate
    /// job needs. With the lease, the step also counts the run in the turn's ledger
    /// ([`crate::state::RUNS_BEGUN`]: readers see the turn `running` from then on, and a
    /// run that dies before writing is counted) and reads whether the turn was asked to stop;
    /// with no session stored, `contexts` (when given) are latched as
    /// [`RecordWriter::latch_contexts`] does and the latched ones come back. With `probe` — a
    /// key another part of the same server names (the retrieval index) — and the lease, a
    /// store that reaches it ([`SessionStore::steps_reach_other_keys`]) also says whether it
    /// exists ([`Begun::probed`]). One atomic step (Redis: one script; embedded: one lock).
    #[allow(clippy::too_many_arguments)]
    async fn begin_turn(
        &self,
        grant: &Grant,
        session: &SessionId,
        turn: &TurnId,
        holder: &str,
        ttl: Duration,
        contexts: Option<&ContextIds>,
        probe: Option<&str>,
    ) -> Result<Begun, StoreError>;
    /// Whether the steps of a run reach other keys of the store's server than the session's
    /// own (Redis: a standalone server, whose scripts reach keys of any slot): the begin step
    /// can then look for a key another part names (`probe`), and a run's write can add to
    /// counters another part keeps ([`RunWrite::counts`]).
    fn steps_reach_other_keys(&self) -> bool {
        false
    }
    /// Gives a lease back (no effect when it was already lost).
    async fn release_lease(
        &self,
        grant: &Grant,
        session: &SessionId,
        lease: &Lease,
    ) -> Result<(), StoreError>;
    /// Writes the turn record and, when given, the session state, in one atomic step checked
    /// against the lease; with `release`, the lease is released in the same step. The
    /// session's pending conversation items are appended to its stored conversation in the
    /// same step (the caller drops them once the save succeeded). Reads in that step whether
    /// the turn was asked to stop ([`StoreReader::cancel_requested`]): a request made before
    /// the write is seen, and one made after it meets the record as written.
    async fn save(
        &self,
        grant: &Grant,
        session: Option<&SessionState>,
        turn: &TurnRecord,
        lease: &Lease,
        release: bool,
    ) -> Result<Saved, StoreError>;
    /// A run's write: [`SessionStore::save`], knowing what the run knows of the record
    /// ([`RunWrite::stored`]) and adding its counters in the same step where the store can
    /// ([`SessionStore::steps_reach_other_keys`]; [`Saved::counts_missed`] says when it did
    /// not).
    async fn save_run(&self, grant: &Grant, write: RunWrite<'_>) -> Result<Saved, StoreError> {
        let mut saved = self
            .save(grant, write.session, write.turn, write.lease, write.release)
            .await?;
        saved.counts_missed = write.counts.is_some_and(|c| !c.adds.is_empty());
        Ok(saved)
    }
    /// Records one server tool's output in the turn's ledger before the next model call and,
    /// when the tool changed the session (its mode), the session — in one atomic step checked
    /// against the lease, so a resumed run finds both or neither. The session is the run's
    /// own (only the lease holder writes it), so it need not be stored yet.
    async fn record_tool_output(
        &self,
        grant: &Grant,
        session: &SessionId,
        turn: &TurnId,
        entry: ToolOutput<'_>,
        lease: &Lease,
    ) -> Result<(), StoreError>;
}

/// Turns read from the store at once when reading a batch back (progress, results, retries).
pub const BATCH_READ_CHUNK: usize = 500;

/// Counts `batch`'s turns by status (what `GET /v1/batches/{id}` answers, and the data of a
/// `batch.completed` event).
pub async fn batch_progress(
    store: &dyn StoreReader,
    batch: &BatchRecord,
) -> Result<crate::state::BatchProgress, StoreError> {
    let mut p = crate::state::BatchProgress {
        batch_id: batch.batch_id.clone(),
        total: batch.total,
        rejected: batch.rejected.len(),
        retry_of: batch.retry_of.clone(),
        retried_as: batch.retried_as.clone(),
        ..Default::default()
    };
    for chunk in batch.items.chunks(BATCH_READ_CHUNK) {
        let ids: Vec<_> = chunk
            .iter()
            .map(|i| (i.session_id.clone(), i.turn_id.clone()))
            .collect();
        for record in store.get_turns(&ids).await? {
            let slot = match record.map(|r| r.status) {
                None => &mut p.expired,
                Some(TurnStatus::Queued) => &mut p.queued,
                Some(TurnStatus::Running) => &mut p.running,
                Some(TurnStatus::AwaitingClientTools) => &mut p.awaiting_client_tools,
                Some(TurnStatus::Completed) => &mut p.completed,
                Some(TurnStatus::Failed) => &mut p.failed,
                Some(TurnStatus::Cancelled) => &mut p.cancelled,
            };
            *slot += 1;
        }
    }
    Ok(p)
}
