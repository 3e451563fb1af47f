//! The embedded in-memory store: one process, no persistence, no expiry. Same lease and fencing
//! semantics as the Redis store (the conformance suite runs against both).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod records;

use super::{
    BatchRecord, Begun, ContextIds, Grant, IndexedTurn, Lease, RunsPage, RunsPosition, Saved,
    SessionState, SessionStore, StoreError, StoreReader, ToolOutput, TurnRecord,
};
use crate::contract::{SessionId, TurnId};

/// Sessions and turns in process memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    fenced: AtomicU64,
    saves: AtomicU64,
}

/// A streaming turn's latest live events, and until when they are kept.
type KeptLive = (Instant, std::collections::VecDeque<Vec<u8>>);

/// A batch's completion as noted so far.
#[derive(Debug, Default)]
struct BatchLines {
    settled: std::collections::HashSet<(SessionId, TurnId)>,
    lines: Option<usize>,
    done: bool,
    /// Each line's turn events not yet delivered or given up on, by URL.
    pending: HashMap<(SessionId, TurnId), std::collections::HashSet<String>>,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<SessionId, SessionState>,
    conversations: HashMap<SessionId, Vec<serde_json::Value>>,
    turns: HashMap<(SessionId, TurnId), TurnRecord>,
    order: HashMap<SessionId, Vec<TurnId>>,
    leases: HashMap<SessionId, (Lease, Instant)>,
    fences: HashMap<SessionId, u64>,
    owners: HashMap<SessionId, String>,
    contexts: HashMap<SessionId, ContextIds>,
    cancels: std::collections::HashSet<(SessionId, TurnId)>,
    batches: HashMap<String, BatchRecord>,
    /// Workers' heartbeats, by worker.
    heartbeats: HashMap<String, Vec<u8>>,
    /// What is known of each batch's lines ([`SessionStore::note_batch`]).
    batch_lines: HashMap<String, BatchLines>,
    /// Sessions marked watched, until when (expired ones are dropped at the next mark).
    watched: HashMap<SessionId, Instant>,
    /// Streaming turns' latest live events, kept until when.
    live: HashMap<(SessionId, TurnId), KeptLive>,
    /// The runs of each turn begun (what the Redis store keeps in the turn's ledger).
    runs: HashMap<(SessionId, TurnId), u32>,
    /// Calls' prompts, by id (kept as long as the store: turn records are too).
    prompts: HashMap<String, String>,
    /// Each tenant's runs index.
    runs_index: HashMap<String, RunsIndex>,
}

/// A tenant's runs index: the entries in order, and the names noted (a turn noted again
/// keeps its first time).
#[derive(Debug, Default)]
struct RunsIndex {
    order: std::collections::BTreeMap<RunsPosition, IndexedTurn>,
    noted: std::collections::HashSet<String>,
}

impl Inner {
    /// A turn as a reader sees it: the record with the runs begun.
    fn turn(&self, key: &(SessionId, TurnId)) -> Option<TurnRecord> {
        let mut record = self.turns.get(key)?.clone();
        record.with_runs_begun(self.runs.get(key).copied().unwrap_or(0));
        Some(record)
    }

    /// Stores `s`, its conversation items appended to the session's conversation.
    fn store_session(&mut self, s: &SessionState) {
        self.conversations
            .entry(s.session_id.clone())
            .or_default()
            .extend(s.conversation.iter().cloned());
        let stored = SessionState {
            conversation: Vec::new(),
            ..s.clone()
        };
        self.sessions.insert(s.session_id.clone(), stored);
    }

    /// Takes `session`'s lease for `holder` unless another holder has it.
    fn take_lease(&mut self, session: &SessionId, holder: &str, ttl: Duration) -> Option<Lease> {
        if self
            .leases
            .get(session)
            .is_some_and(|(_, until)| *until > Instant::now())
        {
            return None;
        }
        let token = self.fences.entry(session.clone()).or_insert(0);
        *token += 1;
        let lease = Lease {
            token: *token,
            holder: holder.to_string(),
        };
        self.leases
            .insert(session.clone(), (lease.clone(), Instant::now() + ttl));
        Some(lease)
    }

    fn holds(&self, session: &SessionId, lease: &Lease) -> bool {
        self.leases
            .get(session)
            .is_some_and(|(l, until)| l == lease && *until > Instant::now())
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, StoreError> {
        self.inner
            .lock()
            .map_err(|_| StoreError::Unavailable("in-memory store lock poisoned".into()))
    }

    /// How many turn writes ([`SessionStore::save`]) this store has taken: a turn's cost in
    /// writes, which the pipeline keeps to as few as its guarantees need.
    pub fn saves(&self) -> u64 {
        self.saves.load(Ordering::Relaxed)
    }

    fn fenced(&self, session: &SessionId) -> StoreError {
        self.fenced.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(session_id = %session, "rejected a write from a stale lease holder");
        StoreError::Fenced(session.to_string())
    }
}

#[async_trait::async_trait]
impl StoreReader for MemoryStore {
    async fn get_session(&self, id: &SessionId) -> Result<Option<SessionState>, StoreError> {
        Ok(self.lock()?.sessions.get(id).cloned())
    }

    async fn get_turn(
        &self,
        session: &SessionId,
        turn: &TurnId,
    ) -> Result<Option<TurnRecord>, StoreError> {
        Ok(self.lock()?.turn(&(session.clone(), turn.clone())))
    }

    async fn list_turns(&self, session: &SessionId) -> Result<Vec<TurnId>, StoreError> {
        Ok(self.lock()?.order.get(session).cloned().unwrap_or_default())
    }

    async fn owner(&self, session: &SessionId) -> Result<Option<String>, StoreError> {
        Ok(self.lock()?.owners.get(session).cloned())
    }

    async fn cancel_requested(
        &self,
        session: &SessionId,
        turn: &TurnId,
    ) -> Result<bool, StoreError> {
        Ok(self
            .lock()?
            .cancels
            .contains(&(session.clone(), turn.clone())))
    }

    async fn latched_contexts(
        &self,
        session: &SessionId,
    ) -> Result<Option<ContextIds>, StoreError> {
        Ok(self.lock()?.contexts.get(session).cloned())
    }

    async fn conversation(
        &self,
        session: &SessionId,
    ) -> Result<Vec<serde_json::Value>, StoreError> {
        Ok(self
            .lock()?
            .conversations
            .get(session)
            .cloned()
            .unwrap_or_default())
    }

    async fn kept_live(
        &self,
        session: &SessionId,
        turn: &TurnId,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let inner = self.lock()?;
        let now = Instant::now();
        Ok(inner
            .live
            .get(&(session.clone(), turn.clone()))
            .filter(|(until, _)| *until > now)
            .map(|(_, events)| events.iter().cloned().collect())
            .unwrap_or_default())
    }

    fn fenced_rejections(&self) -> u64 {
        self.fenced.load(Ordering::Relaxed)
    }

    async fn get_batch(&self, id: &str) -> Result<Option<BatchRecord>, StoreError> {
        Ok(self.lock()?.batches.get(id).cloned())
    }

    async fn prompts(
        &self,
        ids: &[String],
    ) -> Result<std::collections::BTreeMap<String, String>, StoreError> {
        let inner = self.lock()?;
        Ok(ids
            .iter()
            .filter_map(|id| Some((id.clone(), inner.prompts.get(id)?.clone())))
            .collect())
    }

    async fn heartbeats(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(self
            .lock()?
            .heartbeats
            .iter()
            .map(|(w, b)| (w.clone(), b.clone()))
            .collect())
    }

    async fn recent_turns(
        &self,
        tenant: &str,
        page: &RunsPage,
    ) -> Result<Vec<IndexedTurn>, StoreError> {
        let inner = self.lock()?;
        let Some(index) = inner.runs_index.get(tenant) else {
            return Ok(Vec::new());
        };
        use std::ops::Bound::{Excluded, Unbounded};
        let end = page.after.clone().map_or(Unbounded, Excluded);
        Ok(index
            .order
            .range((Unbounded, end))
            .rev()
            .skip_while(|(p, _)| page.until_ms.is_some_and(|u| p.at_ms > u))
            .take_while(|(p, _)| page.since_ms.is_none_or(|s| p.at_ms >= s))
            .take(page.max)
            .map(|(_, e)| e.clone())
            .collect())
    }

    async fn list_batches(&self, tenant: &str, max: usize) -> Result<Vec<String>, StoreError> {
        let state = self.lock()?;
        let mut theirs: Vec<&BatchRecord> = state
            .batches
            .values()
            .filter(|b| b.tenant == tenant)
            .collect();
        // RFC 3339 times of one clock in UTC sort as text; the id breaks ties.
        theirs.sort_by(|a, b| (&b.created_at, &b.batch_id).cmp(&(&a.created_at, &a.batch_id)));
        Ok(theirs
            .into_iter()
            .take(max)
            .map(|b| b.batch_id.clone())
            .collect())
    }
}

#[async_trait::async_trait]
impl SessionStore for MemoryStore {
    async fn create_turn(
        &self,
        _grant: &Grant,
        turn: &TurnRecord,
    ) -> Result<Option<TurnRecord>, StoreError> {
        let mut inner = self.lock()?;
        let key = (turn.session_id.clone(), turn.turn_id.clone());
        if let Some(existing) = inner.turn(&key) {
            return Ok(Some(existing));
        }
        inner.turns.insert(key, turn.clone());
        inner
            .order
            .entry(turn.session_id.clone())
            .or_default()
            .push(turn.turn_id.clone());
        Ok(None)
    }

    async fn discard_turn(&self, _grant: &Grant, turn: &TurnRecord) -> Result<bool, StoreError> {
        let mut inner = self.lock()?;
        let key = (turn.session_id.clone(), turn.turn_id.clone());
        if inner.turns.get(&key) != Some(turn) || inner.runs.contains_key(&key) {
            return Ok(false);
        }
        inner.turns.remove(&key);
        let sid = &turn.session_id;
        if let Some(order) = inner.order.get_mut(sid) {
            order.retain(|t| t != &turn.turn_id);
        }
        // A session left with no turn and no state was never run: the contexts its admission
        // latched go with the turn (a job accepted after all latches them again as it begins).
        let unused =
            inner.order.get(sid).is_none_or(Vec::is_empty) && !inner.sessions.contains_key(sid);
        if unused {
            inner.order.remove(sid);
            inner.contexts.remove(sid);
        }
        Ok(true)
    }

    async fn replace_turn(
        &self,
        _grant: &Grant,
        current: &TurnRecord,
        new: &TurnRecord,
    ) -> Result<bool, StoreError> {
        let mut inner = self.lock()?;
        let key = (current.session_id.clone(), current.turn_id.clone());
        if inner.turn(&key).as_ref() != Some(current) {
            return Ok(false);
        }
        inner.turns.insert(key, new.clone());
        Ok(true)
    }

    async fn acquire_lease(
        &self,
        _grant: &Grant,
        session: &SessionId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        Ok(self.lock()?.take_lease(session, holder, ttl))
    }

    #[allow(clippy::too_many_arguments)]
    async fn begin_turn(
        &self,
        _grant: &Grant,
        session: &SessionId,
        turn: &TurnId,
        holder: &str,
        ttl: Duration,
        contexts: Option<&ContextIds>,
        _probe: Option<&str>,
    ) -> Result<Begun, StoreError> {
        let mut inner = self.lock()?;
        let key = (session.clone(), turn.clone());
        let record = inner.turn(&key).map(Box::new);
        let Some(lease) = inner.take_lease(session, holder, ttl) else {
            return Ok(Begun {
                turn: record,
                lease: None,
                session: None,
                latched: None,
                runs: 0,
                stop_requested: false,
                probed: None,
            });
        };
        let runs = inner.runs.entry(key.clone()).or_insert(0);
        *runs += 1;
        let runs = *runs;
        let state = inner.sessions.get(session).cloned();
        let latched = match (&state, contexts) {
            (None, Some(contexts)) => Some(
                inner
                    .contexts
                    .entry(session.clone())
                    .or_insert_with(|| contexts.clone())
                    .clone(),
            ),
            _ => None,
        };
        Ok(Begun {
            turn: record,
            lease: Some(lease),
            session: state,
            latched,
            runs,
            stop_requested: inner.cancels.contains(&key),
            probed: None,
        })
    }

    async fn renew_lease(
        &self,
        _grant: &Grant,
        session: &SessionId,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let mut inner = self.lock()?;
        if !inner.holds(session, lease) {
            return Ok(false);
        }
        inner
            .leases
            .insert(session.clone(), (lease.clone(), Instant::now() + ttl));
        Ok(true)
    }

    async fn release_lease(
        &self,
        _grant: &Grant,
        session: &SessionId,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        if inner.leases.get(session).is_some_and(|(l, _)| l == lease) {
            inner.leases.remove(session);
        }
        Ok(())
    }

    async fn save(
        &self,
        _grant: &Grant,
        session: Option<&SessionState>,
        turn: &TurnRecord,
        lease: &Lease,
        release: bool,
    ) -> Result<Saved, StoreError> {
        let mut inner = self.lock()?;
        if !inner.holds(&turn.session_id, lease) {
            drop(inner);
            return Err(self.fenced(&turn.session_id));
        }
        self.saves.fetch_add(1, Ordering::Relaxed);
        if let Some(s) = session {
            inner.store_session(s);
        }
        let key = (turn.session_id.clone(), turn.turn_id.clone());
        let mut record = turn.clone();
        // The ledger is append-only: outputs recorded by `record_tool_output` are never lost
        // by a save of an older copy of the record.
        if let Some(existing) = inner.turns.get(&key) {
            for (k, v) in &existing.tool_ledger {
                record
                    .tool_ledger
                    .entry(k.clone())
                    .or_insert_with(|| v.clone());
            }
        } else {
            inner
                .order
                .entry(turn.session_id.clone())
                .or_default()
                .push(turn.turn_id.clone());
        }
        let stop_requested = !release && inner.cancels.contains(&key);
        inner.turns.insert(key, record);
        if release {
            inner.leases.remove(&turn.session_id);
        }
        let now = Instant::now();
        let watched = inner
            .watched
            .get(&turn.session_id)
            .is_some_and(|until| *until > now);
        Ok(Saved {
            stop_requested,
            watched,
            counts_missed: false,
        })
    }

    async fn record_tool_output(
        &self,
        _grant: &Grant,
        session: &SessionId,
        turn: &TurnId,
        entry: ToolOutput<'_>,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        if !inner.holds(session, lease) {
            drop(inner);
            return Err(self.fenced(session));
        }
        let key = (session.clone(), turn.clone());
        let Some(record) = inner.turns.get_mut(&key) else {
            return Err(StoreError::Corrupt(format!(
                "turn {session}/{turn} does not exist"
            )));
        };
        record
            .tool_ledger
            .insert(entry.call_id.to_string(), entry.output.to_string());
        if let Some(state) = entry.session {
            inner.store_session(state);
        }
        Ok(())
    }
}
