//! The embedded store's writes that are not a turn's state ([`RecordWriter`]): owners,
//! latched contexts, cancel requests, live events, watch marks, batches and heartbeats.

use std::time::{Duration, Instant};

use super::MemoryStore;
use crate::contract::{SessionId, TurnId};
use crate::store::{
    BatchRecord, ContextIds, IndexedTurn, Noting, Prompt, RecordWriter, StoreError,
};

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

    async fn keep_prompt(&self, prompt: &Prompt) -> Result<(), StoreError> {
        self.lock()?
            .prompts
            .entry(prompt.id.clone())
            .or_insert_with(|| prompt.json.to_string());
        Ok(())
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
        *until = now + crate::store::LIVE_KEPT;
        events.push_back(event.to_vec());
        while events.len() > crate::store::LIVE_EVENTS_PER_TURN {
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

    fn index_turn(&self, entry: IndexedTurn) -> Noting {
        let noted = self.lock().map(|mut inner| {
            let tenant = entry.session.tenant().to_string();
            let index = inner.runs_index.entry(tenant).or_default();
            // A turn noted again keeps its first time.
            if index.noted.insert(entry.member()) {
                index.order.insert(entry.position(), entry);
            }
        });
        Box::pin(std::future::ready(noted))
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
