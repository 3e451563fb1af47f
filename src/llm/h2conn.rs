//! One HTTP/2 connection to the model server, held here on `h2` itself: a model call is a
//! stream of it, and while it waits the call holds its stream's handle and nothing else —
//! no pooled request future, no task per request, no copied header maps (what a call
//! through reqwest's client holds: ~8 KB more per call in flight, `docs/benchmarks.md`).
//!
//! The connection is opened on the first call (TCP, then TLS with ALPN on `https://`),
//! driven by a task of its own that pings it when idle and drops it when a ping goes
//! unanswered, and opened again by the first call that finds it gone. Calls that find it
//! opening wait for that one connection rather than each opening their own.
//!
//! Owns: opening, keeping and replacing one connection, and sending one request on it.
//! Must not: choose among connections (`connections.rs`), read answers, retry.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::target::{Alpn, Io, Target, connect};

/// A connection's sending half: clones share the connection.
pub(super) type Sender = h2::client::SendRequest<Bytes>;

/// What a call gets to send on.
pub(super) enum Ready {
    /// A stream may be opened now.
    Stream(Sender),
    /// The server chose HTTP/1.1 by ALPN on this connection: the call goes another way (on
    /// it, if it can).
    Http1Chosen(Io),
}

/// One connection to a [`Target`], opened when first needed and again when found gone.
#[derive(Debug)]
pub(super) struct Link {
    target: Arc<Target>,
    /// The open connection's sending half, numbered (so a call that found one gone clears
    /// that one and not its successor); `None` before the first call and once found gone.
    held: tokio::sync::Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    open: Option<(u64, Sender)>,
    opened: u64,
    /// The last opening that failed, and when it ended: the calls that waited for it get
    /// its error rather than each trying again in turn (a server that does not answer would
    /// otherwise hold the last of them for a connect timeout per call before it).
    failed: Option<(std::time::Instant, String)>,
}

impl Link {
    pub(super) fn new(target: Arc<Target>) -> Self {
        Self {
            target,
            held: tokio::sync::Mutex::default(),
        }
    }

    /// The server this link goes to.
    pub(super) fn target(&self) -> &Target {
        &self.target
    }

    /// The connection, ready for one more stream (waiting while the server's limit of
    /// streams is reached); opened (again) if there is none or it is gone.
    pub(super) async fn ready(&self) -> Result<Ready, String> {
        let asked = std::time::Instant::now();
        let current = self.held.lock().await.open.clone();
        if let Some((number, sender)) = current {
            match sender.ready().await {
                Ok(sender) => return Ok(Ready::Stream(sender)),
                Err(e) => {
                    tracing::debug!(error = %e, "the model server's HTTP/2 connection is gone; opening another");
                    let mut held = self.held.lock().await;
                    if held.open.as_ref().is_some_and(|(n, _)| *n == number) {
                        held.open = None;
                    }
                }
            }
        }
        // Opened under the lock: the calls that find the connection gone wait for one new one.
        let mut held = self.held.lock().await;
        let sender = match (&held.open, &held.failed) {
            (Some((_, sender)), _) => sender.clone(),
            (None, Some((at, e))) if *at >= asked => return Err(e.clone()),
            // Boxed: a rare step, kept out of every waiting call's future.
            (None, _) => match Box::pin(open(&self.target)).await {
                Ok(Ready::Stream(sender)) => {
                    held.opened += 1;
                    held.open = Some((held.opened, sender.clone()));
                    held.failed = None;
                    sender
                }
                Ok(chosen @ Ready::Http1Chosen(_)) => return Ok(chosen),
                Err(e) => {
                    held.failed = Some((std::time::Instant::now(), e.clone()));
                    return Err(e);
                }
            },
        };
        drop(held);
        sender
            .ready()
            .await
            .map(Ready::Stream)
            .map_err(|e| e.to_string())
    }
}

/// Opens a connection: TCP, TLS on `https://`, the HTTP/2 handshake; its task drives it.
async fn open(target: &Target) -> Result<Ready, String> {
    match connect(target).await? {
        Io::Plain(tcp) => handshake(tcp, target.pings()).await.map(Ready::Stream),
        Io::Tls(tls) if target.alpn() == Alpn::Both && !Io::chose_h2(&tls) => {
            Ok(Ready::Http1Chosen(Io::Tls(tls)))
        }
        Io::Tls(tls) => handshake(tls, target.pings()).await.map(Ready::Stream),
    }
}

/// Windows a stream and the connection give the server: an answer of a few megabytes
/// (images, long reasoning) is not held to the protocol's 64 KiB at a time, and credit is
/// not memory (what has been read is given back as it is consumed).
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 8 * 1024 * 1024;

async fn handshake<T>(io: T, pings: (Duration, Duration)) -> Result<Sender, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, mut connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .enable_push(false)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(|e| format!("the HTTP/2 handshake failed: {e}"))?;
    let pinger = connection.ping_pong();
    tokio::spawn(async move {
        tokio::select! {
            ended = connection => if let Err(e) = ended {
                tracing::debug!(error = %e, "the model server's HTTP/2 connection ended");
            },
            () = keep_alive(pinger, pings) => tracing::warn!(
                timeout_ms = pings.1.as_millis() as u64,
                "the model server did not answer a ping; its HTTP/2 connection is dropped",
            ),
        }
        // The connection dropped here fails every stream still on it (its calls retry).
    });
    Ok(sender)
}

/// Pings every `every` (`target::PING_EVERY`); returns when a ping goes unanswered for
/// `timeout` (`target::PING_TIMEOUT`). A connection that cannot ping stays as it is.
async fn keep_alive(pinger: Option<h2::PingPong>, (every, timeout): (Duration, Duration)) {
    let Some(mut pinger) = pinger else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(every).await;
        match tokio::time::timeout(timeout, pinger.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            // The connection is closing: its own future says why.
            Ok(Err(_)) => return std::future::pending().await,
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests;
