//! Keeping a session marked as watched while something listens to it, so that workers send
//! its statuses to its watchers (see [`SessionStore::mark_watched`]).
//!
//! Owns: the mark's lifetime around one subscription. Must not: subscribe to anything.

use std::sync::Arc;
use std::time::Duration;

use super::{SessionStore, StoreError};
use crate::contract::SessionId;

/// How long a watcher of a session's events (an SSE stream, a long-poll of a turn accepted
/// elsewhere) keeps the session marked after it has gone.
pub const EVENT_WATCH_LINGER: Duration = Duration::from_secs(60);

/// A session kept marked as watched: marked once before [`WatchMark::hold`] returns, then
/// again every half `linger` while the mark is held, so that after it is dropped (or its
/// process dies) the mark lasts at least `linger` more.
#[derive(Debug)]
pub struct WatchMark {
    refresh: tokio::task::JoinHandle<()>,
}

impl WatchMark {
    /// Marks `session` and keeps it marked while the returned value lives. Fails when the
    /// store cannot be written: the caller's subscription would not be sent anything.
    pub async fn hold(
        store: Arc<dyn SessionStore>,
        session: SessionId,
        linger: Duration,
    ) -> Result<Self, StoreError> {
        let every = (linger / 2).max(Duration::from_millis(100));
        // Marked for `linger` beyond the next refresh: a refresh that is late or fails once
        // does not let the mark lapse while it is held.
        let ttl = linger + every;
        store.mark_watched(&session, ttl).await?;
        let refresh = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = store.mark_watched(&session, ttl).await {
                    tracing::warn!(session_id = %session, error = %e, "cannot renew the session's watch mark; trying again");
                }
            }
        });
        Ok(Self { refresh })
    }
}

impl Drop for WatchMark {
    fn drop(&mut self) {
        self.refresh.abort();
    }
}
