//! The embedded in-memory store: one process, no persistence, no expiry. Same lease and fencing
//! semantics as the Redis store (the conformance suite runs against both).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{
    BatchRecord, ContextIds, Grant, Lease, RecordWriter, Saved, SessionState, SessionStore,
    StoreError, StoreReader, ToolOutput, TurnRecord,
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
}

impl Inner {
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
        Ok(self
            .lock()?
            .turns
            .get(&(session.clone(), turn.clone()))
            .cloned())
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

    async fn heartbeats(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(self
            .lock()?
            .heartbeats
            .iter()
            .map(|(w, b)| (w.clone(), b.clone()))
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
        if let Some(existing) = inner.turns.get(&key) {
            return Ok(Some(existing.clone()));
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
        if inner.turns.get(&key) != Some(turn) {
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
        match inner.turns.get_mut(&key) {
            Some(stored) if stored == current => {
                *stored = new.clone();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn acquire_lease(
        &self,
        _grant: &Grant,
        session: &SessionId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let mut inner = self.lock()?;
        if inner
            .leases
            .get(session)
            .is_some_and(|(_, until)| *until > Instant::now())
        {
            return Ok(None);
        }
        let token = inner.fences.entry(session.clone()).or_insert(0);
        *token += 1;
        let lease = Lease {
            token: *token,
            holder: holder.to_string(),
        };
        inner
            .leases
            .insert(session.clone(), (lease.clone(), Instant::now() + ttl));
        Ok(Some(lease))
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
            inner
                .conversations
                .entry(s.session_id.clone())
                .or_default()
                .extend(s.conversation.iter().cloned());
            let stored = SessionState {
                conversation: Vec::new(),
                ..s.clone()
            };
            inner.sessions.insert(s.session_id.clone(), stored);
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
        let stop_requested = inner.cancels.contains(&key);
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
        })
    }

    async fn record_tool_output(
        &self,
        _grant: &Grant,
        session: &SessionId,
        turn: &TurnId,
        entry: ToolOutput<'_>,
        lease: &Lease,
    ) -> Result<Option<SessionState>, StoreError> {
        let ToolOutput {
            call_id,
            output,
            mode_change,
        } = entry;
        let mut inner = self.lock()?;
        if !inner.holds(session, lease) {
            drop(inner);
            return Err(self.fenced(session));
        }
        let key = (session.clone(), turn.clone());
        if !inner.turns.contains_key(&key) {
            return Err(StoreError::Corrupt(format!(
                "turn {session}/{turn} does not exist"
            )));
        }
        // Both checks come before either write: the step is whole or not at all.
        let changed = match mode_change {
            Some((mode_id, change)) => {
                let mut state = inner.sessions.get(session).cloned().ok_or_else(|| {
                    StoreError::Corrupt(format!("session {session} does not exist"))
                })?;
                state.apply_mode_change(mode_id, change.clone());
                inner.sessions.insert(session.clone(), state.clone());
                Some(state)
            }
            None => None,
        };
        if let Some(record) = inner.turns.get_mut(&key) {
            record
                .tool_ledger
                .insert(call_id.to_string(), output.to_string());
        }
        Ok(changed)
    }
}

#[async_trait::async_trait]
impl RecordWriter for MemoryStore {
    async fn claim_owner(&self, session: &SessionId, tenant: &str) -> Result<String, StoreError> {
        Ok(self
            .lock()?
            .owners
            .entry(session.clone())
            .or_insert_with(|| tenant.to_string())
            .clone())
    }

    async fn latch_contexts(
        &self,
        session: &SessionId,
        contexts: &ContextIds,
    ) -> Result<ContextIds, StoreError> {
        Ok(self
            .lock()?
            .contexts
            .entry(session.clone())
            .or_insert_with(|| contexts.clone())
            .clone())
    }

    async fn request_cancel(&self, session: &SessionId, turn: &TurnId) -> Result<(), StoreError> {
        self.lock()?.cancels.insert((session.clone(), turn.clone()));
        Ok(())
    }
    async fn keep_live(
        &self,
        session: &SessionId,
        turn: &TurnId,
        event: &[u8],
    ) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        let now = Instant::now();
        if inner.live.len() >= 1024 {
            inner.live.retain(|_, (until, _)| *until > now);
        }
        let (until, events) = inner
            .live
            .entry((session.clone(), turn.clone()))
            .or_insert_with(|| (now, std::collections::VecDeque::new()));
        *until = now + super::LIVE_KEPT;
        events.push_back(event.to_vec());
        while events.len() > super::LIVE_EVENTS_PER_TURN {
            events.pop_front();
        }
        Ok(())
    }

    async fn mark_watched(&self, session: &SessionId, ttl: Duration) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        let now = Instant::now();
        inner.watched.retain(|_, until| *until > now);
        let until = inner.watched.entry(session.clone()).or_insert(now);
        *until = (*until).max(now + ttl);
        Ok(())
    }

    async fn put_batch(&self, batch: &BatchRecord) -> Result<(), StoreError> {
        self.lock()?
            .batches
            .insert(batch.batch_id.clone(), batch.clone());
        Ok(())
    }

    async fn put_heartbeat(&self, worker: &str, body: &[u8]) -> Result<(), StoreError> {
        self.lock()?
            .heartbeats
            .insert(worker.to_string(), body.to_vec());
        Ok(())
    }

    async fn drop_heartbeat(&self, worker: &str) -> Result<(), StoreError> {
        self.lock()?.heartbeats.remove(worker);
        Ok(())
    }

    async fn note_batch(
        &self,
        id: &str,
        settled: Option<(&SessionId, &TurnId)>,
        lines: Option<usize>,
    ) -> Result<bool, StoreError> {
        let mut inner = self.lock()?;
        let note = inner.batch_lines.entry(id.to_string()).or_default();
        if let Some((s, t)) = settled {
            note.settled.insert((s.clone(), t.clone()));
        }
        if lines.is_some() {
            note.lines = lines;
        }
        Ok(!note.done && note.lines.is_some_and(|n| note.settled.len() >= n))
    }

    async fn batch_done(&self, id: &str) -> Result<(), StoreError> {
        self.lock()?
            .batch_lines
            .entry(id.to_string())
            .or_default()
            .done = true;
        Ok(())
    }

    async fn expect_line_events(
        &self,
        id: &str,
        (sid, tid): (&SessionId, &TurnId),
        urls: &[&str],
    ) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        let note = inner.batch_lines.entry(id.to_string()).or_default();
        let pending = note.pending.entry((sid.clone(), tid.clone())).or_default();
        pending.extend(urls.iter().map(|u| u.to_string()));
        Ok(())
    }

    async fn line_event_finished(
        &self,
        id: &str,
        (sid, tid): (&SessionId, &TurnId),
        url: &str,
    ) -> Result<bool, StoreError> {
        let mut inner = self.lock()?;
        let note = inner.batch_lines.entry(id.to_string()).or_default();
        let line = (sid.clone(), tid.clone());
        let left = match note.pending.get_mut(&line) {
            Some(pending) => {
                pending.remove(url);
                pending.len()
            }
            None => 0,
        };
        if left == 0 {
            note.pending.remove(&line);
        }
        Ok(left == 0)
    }
}
