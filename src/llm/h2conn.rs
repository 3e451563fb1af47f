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
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use tokio::net::TcpStream;

use super::connections::{PING_EVERY, PING_TIMEOUT};

/// Where a connection goes and how it is opened; shared by every connection to one server.
pub(super) struct Target {
    /// The `/responses` endpoint, as the request's `:scheme`, `:authority` and `:path`.
    uri: http::Uri,
    host: String,
    port: u16,
    /// The TLS set-up on `https://` (with the ALPN protocols offered), and the name checked.
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls_pki_types::ServerName<'static>,
    )>,
    /// The server chooses the version by ALPN: one that does not choose `h2` gets HTTP/1.1.
    negotiated: bool,
    connect_timeout: Duration,
    /// How often an idle connection is pinged, and how long a ping may go unanswered.
    pings: (Duration, Duration),
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("uri", &self.uri)
            .field("tls", &self.tls.is_some())
            .field("negotiated", &self.negotiated)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// A server at `endpoint` (an http(s) URL with a host). `tls` is the client set-up for
    /// `https://` (ignored on `http://`): `negotiated` offers `h2` and `http/1.1` and lets
    /// the server choose, otherwise `h2` alone is offered and spoken whatever the answer.
    pub(super) fn new(
        endpoint: &reqwest::Url,
        tls: rustls::ClientConfig,
        negotiated: bool,
        connect_timeout: Duration,
    ) -> Result<Self, String> {
        let uri: http::Uri = endpoint
            .as_str()
            .parse()
            .map_err(|e| format!("the endpoint is not a URI: {e}"))?;
        let host = endpoint
            .host_str()
            .ok_or_else(|| "the endpoint has no host".to_string())?
            // An IPv6 literal is written in brackets in a URL, bare to the resolver.
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = endpoint
            .port_or_known_default()
            .ok_or_else(|| "the endpoint has no port".to_string())?;
        let tls = if endpoint.scheme() == "https" {
            let mut tls = tls;
            tls.alpn_protocols = if negotiated {
                vec![b"h2".to_vec(), b"http/1.1".to_vec()]
            } else {
                vec![b"h2".to_vec()]
            };
            let name = rustls_pki_types::ServerName::try_from(host.clone())
                .map_err(|e| format!("{host:?} is not a name TLS can check: {e}"))?;
            Some((tokio_rustls::TlsConnector::from(Arc::new(tls)), name))
        } else {
            None
        };
        Ok(Self {
            uri,
            host,
            port,
            tls,
            negotiated,
            connect_timeout,
            pings: (PING_EVERY, PING_TIMEOUT),
        })
    }

    /// Pings every `every`, a connection dropped when one goes unanswered for `timeout`.
    #[cfg(test)]
    fn pinging(mut self, every: Duration, timeout: Duration) -> Self {
        self.pings = (every, timeout);
        self
    }

    /// A `POST` of `length` bytes of JSON to the endpoint, with the model key and the trace's
    /// parent when given.
    pub(super) fn request(
        &self,
        length: usize,
        key: Option<&str>,
        traceparent: Option<String>,
    ) -> Result<http::Request<()>, String> {
        let mut request = http::Request::post(self.uri.clone())
            .body(())
            .map_err(|e| format!("the request cannot be made: {e}"))?;
        let headers = request.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
        if let Some(key) = key {
            let mut value = HeaderValue::try_from(format!("Bearer {key}"))
                .map_err(|_| "the model key cannot be sent in a header".to_string())?;
            // Never kept in the connection's header table (HPACK never-indexed).
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        if let Some(traceparent) = traceparent
            && let Ok(value) = HeaderValue::try_from(traceparent)
        {
            headers.insert(crate::trace::TRACEPARENT, value);
        }
        Ok(request)
    }
}

/// A connection's sending half: clones share the connection.
pub(super) type Sender = h2::client::SendRequest<Bytes>;

/// What a call gets to send on.
pub(super) enum Ready {
    /// A stream may be opened now.
    Stream(Sender),
    /// The server chose HTTP/1.1 by ALPN: the call goes another way.
    Http1Chosen,
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
            (None, _) => match open(&self.target).await {
                Ok(Ready::Stream(sender)) => {
                    held.opened += 1;
                    held.open = Some((held.opened, sender.clone()));
                    held.failed = None;
                    sender
                }
                Ok(Ready::Http1Chosen) => return Ok(Ready::Http1Chosen),
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
    let connect = TcpStream::connect((target.host.as_str(), target.port));
    let tcp = tokio::time::timeout(target.connect_timeout, connect)
        .await
        .map_err(|_| "connecting timed out".to_string())?
        .map_err(|e| format!("cannot connect: {e}"))?;
    // A request is written in one go; Nagle's delay would only hold its last segment.
    let _ = tcp.set_nodelay(true);
    let Some((connector, name)) = &target.tls else {
        return handshake(tcp, target.pings).await.map(Ready::Stream);
    };
    let tls = tokio::time::timeout(target.connect_timeout, connector.connect(name.clone(), tcp))
        .await
        .map_err(|_| "the TLS handshake timed out".to_string())?
        .map_err(|e| format!("the TLS handshake failed: {e}"))?;
    if target.negotiated && tls.get_ref().1.alpn_protocol() != Some(b"h2") {
        return Ok(Ready::Http1Chosen);
    }
    handshake(tls, target.pings).await.map(Ready::Stream)
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

/// Pings every `every` ([`PING_EVERY`]); returns when a ping goes unanswered for `timeout`
/// ([`PING_TIMEOUT`]). A connection that cannot ping stays as it is.
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
