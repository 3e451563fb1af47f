//! Where the model client's own connections go and how one is opened: the server's address,
//! its TLS set-up with the ALPN protocols offered, the request a call sends (`h2conn.rs`,
//! `h1conn.rs`), and an opened connection as what HTTP/1.1 reads and writes (`h1wire.rs`).
//!
//! Owns: the endpoint as a target, TCP and TLS opening, the request head. Must not: speak a
//! version of HTTP.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How often an idle HTTP/2 connection is pinged, and how long a ping may go unanswered
/// before the connection counts as dead: one dead connection would otherwise hold every call
/// on it until the call's own timeout.
pub(super) const PING_EVERY: Duration = Duration::from_secs(20);
pub(super) const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// What a TLS connection offers by ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Alpn {
    /// `h2` alone, spoken whatever the answer.
    H2,
    /// `h2` and `http/1.1`: the server chooses.
    Both,
    /// `http/1.1` alone.
    Http1,
}

/// Where a connection goes and how it is opened; shared by every connection to one server.
pub(super) struct Target {
    /// The `/responses` endpoint, as the request's `:scheme`, `:authority` and `:path`.
    uri: http::Uri,
    /// An HTTP/1.1 request's head up to its per-call headers: the request line (the
    /// endpoint's path), `host` (its authority) and `content-type`.
    http1_head: Vec<u8>,
    host: String,
    port: u16,
    /// The TLS set-up on `https://` (with the ALPN protocols offered), and the name checked.
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls_pki_types::ServerName<'static>,
    )>,
    /// What TLS offers by ALPN.
    alpn: Alpn,
    connect_timeout: Duration,
    /// How often an idle connection is pinged, and how long a ping may go unanswered.
    pings: (Duration, Duration),
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("uri", &self.uri)
            .field("tls", &self.tls.is_some())
            .field("alpn", &self.alpn)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// A server at `endpoint` (an http(s) URL with a host). `tls` is the client set-up for
    /// `https://` (ignored on `http://`), offering `alpn`.
    pub(super) fn new(
        endpoint: &reqwest::Url,
        tls: rustls::ClientConfig,
        alpn: Alpn,
        connect_timeout: Duration,
    ) -> Result<Self, String> {
        // Credentials in the URL go as basic auth, which only the general client sends; here
        // they would end up in `Host` (and `:authority`), which must not carry them.
        if !endpoint.username().is_empty() || endpoint.password().is_some() {
            return Err("the endpoint's URL carries credentials".to_string());
        }
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
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let authority = uri.authority().map_or("", |a| a.as_str());
        if !field_value(path) || path.contains(' ') || !field_value(authority) {
            return Err("the endpoint's path or host cannot be sent in a request".to_string());
        }
        let http1_head = format!(
            "POST {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\n"
        )
        .into_bytes();
        let tls = if endpoint.scheme() == "https" {
            let mut tls = tls;
            tls.alpn_protocols = match alpn {
                Alpn::H2 => vec![b"h2".to_vec()],
                Alpn::Both => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
                Alpn::Http1 => vec![b"http/1.1".to_vec()],
            };
            let name = rustls_pki_types::ServerName::try_from(host.clone())
                .map_err(|e| format!("{host:?} is not a name TLS can check: {e}"))?;
            Some((tokio_rustls::TlsConnector::from(Arc::new(tls)), name))
        } else {
            None
        };
        Ok(Self {
            uri,
            http1_head,
            host,
            port,
            tls,
            alpn,
            connect_timeout,
            pings: (PING_EVERY, PING_TIMEOUT),
        })
    }

    /// What TLS offers by ALPN.
    pub(super) fn alpn(&self) -> Alpn {
        self.alpn
    }

    /// How often an idle HTTP/2 connection is pinged, and how long a ping may go unanswered.
    pub(super) fn pings(&self) -> (Duration, Duration) {
        self.pings
    }

    /// Pings every `every`, a connection dropped when one goes unanswered for `timeout`.
    #[cfg(test)]
    pub(super) fn pinging(mut self, every: Duration, timeout: Duration) -> Self {
        self.pings = (every, timeout);
        self
    }

    /// A `POST` of `length` bytes of JSON to the endpoint over HTTP/2 (to its `:scheme`,
    /// `:authority` and `:path`), with the model key and the trace's parent when given.
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
                .map_err(|_| KEY_NOT_SENDABLE.to_string())?;
            // Never kept in an HTTP/2 connection's header table (HPACK never-indexed).
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

    /// The same request's head over HTTP/1.1 (to the endpoint's path, with `host`), ending in
    /// its blank line.
    pub(super) fn http1_head(
        &self,
        length: usize,
        key: Option<&str>,
        traceparent: Option<&str>,
    ) -> Result<Vec<u8>, String> {
        use std::io::Write as _;
        let mut head = Vec::with_capacity(self.http1_head.len() + 192);
        head.extend_from_slice(&self.http1_head);
        // Writing to a Vec cannot fail.
        let _ = write!(head, "content-length: {length}\r\n");
        if let Some(key) = key {
            if !field_value(key) {
                return Err(KEY_NOT_SENDABLE.to_string());
            }
            let _ = write!(head, "authorization: Bearer {key}\r\n");
        }
        if let Some(traceparent) = traceparent
            && field_value(traceparent)
        {
            let _ = write!(head, "traceparent: {traceparent}\r\n");
        }
        head.extend_from_slice(b"\r\n");
        Ok(head)
    }
}

/// What a call says when the model key cannot go in a header.
const KEY_NOT_SENDABLE: &str = "the model key cannot be sent in a header";

/// Whether `value` can be sent as a header's value as it is (no line breaks or other control
/// characters, which would end the header early).
fn field_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// An opened connection: plain TCP, or TLS over it.
pub(super) enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Io {
    /// Whether the server chose `h2` by ALPN.
    pub(super) fn chose_h2(tls: &tokio_rustls::client::TlsStream<TcpStream>) -> bool {
        tls.get_ref().1.alpn_protocol() == Some(b"h2")
    }
}

impl crate::h1::Wire for Io {
    async fn readable(&self) -> std::io::Result<()> {
        match self {
            Self::Plain(tcp) => tcp.readable().await,
            // TLS may hold bytes it already read and decrypted: the read itself tells.
            Self::Tls(_) => Ok(()),
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(tcp) => tcp.is_write_vectored(),
            Self::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Opens a connection to `target`: TCP, then TLS on `https://`, each within the connect timeout.
pub(super) async fn connect(target: &Target) -> Result<Io, String> {
    let connect = TcpStream::connect((target.host.as_str(), target.port));
    let tcp = tokio::time::timeout(target.connect_timeout, connect)
        .await
        .map_err(|_| "connecting timed out".to_string())?
        .map_err(|e| format!("cannot connect: {e}"))?;
    // A request is written in one go; Nagle's delay would only hold its last segment.
    let _ = tcp.set_nodelay(true);
    let Some((connector, name)) = &target.tls else {
        return Ok(Io::Plain(tcp));
    };
    let tls = tokio::time::timeout(target.connect_timeout, connector.connect(name.clone(), tcp))
        .await
        .map_err(|_| "the TLS handshake timed out".to_string())?
        .map_err(|e| format!("the TLS handshake failed: {e}"))?;
    Ok(Io::Tls(Box::new(tls)))
}
