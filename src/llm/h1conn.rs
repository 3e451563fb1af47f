//! HTTP/1.1 connections to the model server: a call takes an idle connection (or opens one:
//! HTTP/1.1 carries one call at a time), sends on it, and gives it back once its answer is
//! read. While it waits a call holds its connection and nothing more: no task, no buffers
//! (`h1wire.rs` reads and writes).
//!
//! An idle connection is kept for [`IDLE`] (reqwest's default), newest first; one the server
//! closed, or whose answer was not read to its end, is dropped when found.
//!
//! Owns: opening, keeping and reusing connections. Must not: choose the version, parse
//! answers, retry a call the server may have seen.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;

use super::h1wire::Conn;
use super::target::{Io, Target, connect};

/// How long an idle connection is kept.
const IDLE: Duration = Duration::from_secs(90);

/// The idle connections to one [`Target`].
#[derive(Debug)]
pub(super) struct Pool {
    target: Arc<Target>,
    /// Oldest first, each with when it was given back.
    idle: Mutex<VecDeque<(Instant, Conn<Io>)>>,
}

impl Pool {
    pub(super) fn new(target: Arc<Target>) -> Self {
        Self {
            target,
            idle: Mutex::default(),
        }
    }

    /// The server the connections go to.
    pub(super) fn target(&self) -> &Target {
        &self.target
    }

    /// A connection for one call: the newest idle one still open, else a new one.
    pub(super) async fn checkout(self: &Arc<Self>) -> Result<Checkout, String> {
        if let Some(conn) = self.take_idle() {
            return Ok(self.lend(conn, true));
        }
        // Boxed: a rare step, kept out of every waiting call's future.
        let io = Box::pin(connect(&self.target)).await?;
        Ok(self.lend(Conn::new(io), false))
    }

    /// A connection opened elsewhere (TLS on which the server chose HTTP/1.1), for one call.
    pub(super) fn adopt(self: &Arc<Self>, io: Io) -> Checkout {
        self.lend(Conn::new(io), false)
    }

    fn lend(self: &Arc<Self>, conn: Conn<Io>, reused: bool) -> Checkout {
        Checkout {
            pool: Arc::clone(self),
            conn: Some(conn),
            reused,
        }
    }

    /// The newest idle connection still open; those idle too long are dropped.
    fn take_idle(&self) -> Option<Conn<Io>> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        while idle.front().is_some_and(|(since, _)| now - *since > IDLE) {
            idle.pop_front();
        }
        while let Some((_, mut conn)) = idle.pop_back() {
            if conn.still_open() {
                return Some(conn);
            }
        }
        None
    }

    /// How many connections are idle (for tests).
    #[cfg(test)]
    pub(super) fn idle(&self) -> usize {
        self.idle.lock().map_or(0, |i| i.len())
    }
}

/// A connection taken for one call; given back to its pool when dropped if the call's answer
/// was read to its end and the server keeps the connection. A call cut short (timed out,
/// cancelled, broken off) takes its connection with it: what the server still sends on it
/// belongs to no one.
#[derive(Debug)]
pub(super) struct Checkout {
    pool: Arc<Pool>,
    /// Always there until dropped.
    conn: Option<Conn<Io>>,
    /// Whether the connection carried an earlier call.
    reused: bool,
}

impl Checkout {
    /// Sends a request (its `head`, then the body's pieces). A request an idle connection
    /// could not take (the server closed it as the call began) goes once more on a new
    /// connection; one that went out is never sent again here.
    pub(super) async fn send(&mut self, head: &[u8], body: &[&[u8]; 3]) -> Result<(), String> {
        let conn = self.conn.as_mut().ok_or(GIVEN_BACK)?;
        let Err(e) = conn.send(head, body).await else {
            return Ok(());
        };
        if !self.reused {
            return Err(e.to_string());
        }
        self.reused = false;
        let io = Box::pin(connect(&self.pool.target)).await?;
        let conn = self.conn.insert(Conn::new(io));
        conn.send(head, body).await.map_err(|e| e.to_string())
    }

    /// The answer's status and headers.
    pub(super) async fn answer(&mut self) -> Result<(u16, HeaderMap), String> {
        self.conn.as_mut().ok_or(GIVEN_BACK)?.answer().await
    }

    /// The answer's next piece, `None` at its end.
    pub(super) async fn piece(&mut self) -> Result<Option<Bytes>, String> {
        self.conn.as_mut().ok_or(GIVEN_BACK)?.piece().await
    }
}

/// What a checkout's use after its connection went says (it cannot happen: the connection
/// goes only when the checkout is dropped).
const GIVEN_BACK: &str = "the connection was given back";

impl Drop for Checkout {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if !conn.between_calls() {
            return;
        }
        let mut idle = self.pool.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.push_back((Instant::now(), conn));
    }
}

#[cfg(test)]
mod tests;
