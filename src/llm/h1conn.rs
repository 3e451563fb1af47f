//! HTTP/1.1 connections to the model server, held here on hyper's connection-level client: a
//! call takes an idle connection (or opens one: HTTP/1.1 carries one call at a time), sends
//! on it, and gives it back once its answer is read. While it waits a call holds its
//! connection's checkout and its answer's channel — not a pooled client's request, its
//! service stack and its copied header maps (what a call through reqwest's client held).
//!
//! An idle connection is kept for [`IDLE`] (reqwest's default), newest first; one the server
//! closed, or whose answer was not read to its end, is dropped when found.
//!
//! Owns: opening, keeping and reusing connections. Must not: choose the version, read answers,
//! retry.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use super::target::{Io, Target, connect};

/// How long an idle connection is kept.
const IDLE: Duration = Duration::from_secs(90);

/// A connection's sending half.
type Sender = http1::SendRequest<Full<Bytes>>;

/// The idle connections to one [`Target`].
#[derive(Debug)]
pub(super) struct Pool {
    target: Arc<Target>,
    /// Oldest first, each with when it was given back.
    idle: Mutex<VecDeque<(Instant, Sender)>>,
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

    /// A connection ready for one request: the newest idle one that still is, else a new one.
    pub(super) async fn checkout(self: &Arc<Self>) -> Result<Checkout, String> {
        while let Some(mut sender) = self.take_idle() {
            if sender.ready().await.is_ok() {
                return Ok(Checkout {
                    pool: Arc::clone(self),
                    sender: Some(sender),
                    answered: false,
                });
            }
        }
        // Boxed, as each opening below: a rare step, kept out of every waiting call's future.
        let sender = Box::pin(open(&self.target)).await?;
        Ok(Checkout {
            pool: Arc::clone(self),
            sender: Some(sender),
            answered: false,
        })
    }

    /// A connection opened elsewhere (TLS on which the server chose HTTP/1.1), for one call.
    pub(super) async fn adopt(self: &Arc<Self>, io: Io) -> Result<Checkout, String> {
        let sender = match io {
            Io::Plain(tcp) => Box::pin(handshake(tcp)).await?,
            Io::Tls(tls) => Box::pin(handshake(tls)).await?,
        };
        Ok(Checkout {
            pool: Arc::clone(self),
            sender: Some(sender),
            answered: false,
        })
    }

    /// The newest idle connection not known to be closed; those idle too long are dropped.
    fn take_idle(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        while idle.front().is_some_and(|(since, _)| now - *since > IDLE) {
            idle.pop_front();
        }
        while let Some((_, sender)) = idle.pop_back() {
            if !sender.is_closed() {
                return Some(sender);
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
/// was read to its end (the body holds it) and it is still open. A call cut short (timed
/// out, cancelled, broken off) takes its connection with it: what the server still sends on
/// it belongs to no one.
#[derive(Debug)]
pub(super) struct Checkout {
    pool: Arc<Pool>,
    sender: Option<Sender>,
    answered: bool,
}

impl Checkout {
    /// Sends `request` on the connection. A request an idle connection could not take (the
    /// server closed it as the call began) goes once more on a new connection.
    pub(super) async fn send(
        &mut self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>, String> {
        let sender = self
            .sender
            .as_mut()
            .ok_or_else(|| "the connection was given back".to_string())?;
        let unsent = match sender.try_send_request(request).await {
            Ok(response) => return Ok(response),
            Err(mut error) => match error.take_message() {
                Some(unsent) => unsent,
                None => return Err(error.into_error().to_string()),
            },
        };
        let fresh = self.sender.insert(Box::pin(open(&self.pool.target)).await?);
        fresh.send_request(unsent).await.map_err(|e| e.to_string())
    }

    /// Notes that the answer was read to its end: the connection may carry another call.
    pub(super) fn answered(&mut self) {
        self.answered = true;
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let Some(sender) = self.sender.take() else {
            return;
        };
        if !self.answered || sender.is_closed() {
            return;
        }
        let mut idle = self.pool.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.push_back((Instant::now(), sender));
    }
}

/// Opens a connection (TCP, TLS offering `http/1.1` on `https://`); its task drives it.
async fn open(target: &Target) -> Result<Sender, String> {
    match connect(target).await? {
        Io::Plain(tcp) => handshake(tcp).await,
        Io::Tls(tls) => handshake(tls).await,
    }
}

async fn handshake<T>(io: T) -> Result<Sender, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("the HTTP/1.1 connection could not start: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "a model server's HTTP/1.1 connection ended");
        }
    });
    Ok(sender)
}

#[cfg(test)]
mod tests;
