//! The HTTP connections a model client calls over: HTTP/1.1, one connection per call in
//! flight (reqwest's pool keeps them for the next calls), or HTTP/2, every call a stream on one
//! of a few connections.
//!
//! A call waiting on its model holds its connection's buffers: over HTTP/1.1 hyper keeps a read
//! buffer, a write buffer and a request channel per connection, about 25 KiB, so a thousand
//! calls in flight hold a thousand connections. Over HTTP/2 the calls share the connections
//! and a waiting stream holds little. hyper opens one HTTP/2 connection per client and
//! queues the streams a server's `SETTINGS_MAX_CONCURRENT_STREAMS` (often 100) leaves no room
//! for, so the calls are spread round-robin over `connections` clients, each with its own
//! connection.
//!
//! Owns: which client a call goes out on. Must not: know what a call carries.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How calls reach the model server (`model.http`, `model.http2_connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelHttp {
    /// HTTP/1.1: a connection per call in flight.
    #[default]
    Http1,
    /// HTTP/2 on `connections` connections: prior knowledge on `http://` (h2c), ALPN on
    /// `https://` (a server that does not offer `h2` is refused).
    Http2 {
        /// Connections the calls are spread over.
        connections: NonZeroUsize,
    },
}

impl ModelHttp {
    /// `http1` or `http2` (with `connections` connections), as the setting writes it.
    pub fn parse(text: &str, connections: usize) -> Result<Self, String> {
        match text {
            "http1" => Ok(Self::Http1),
            "http2" => NonZeroUsize::new(connections)
                .map(|connections| Self::Http2 { connections })
                .ok_or_else(|| "HTTP/2 needs at least one connection".to_string()),
            other => Err(format!("{other:?} is not http1 or http2")),
        }
    }
}

/// How often an idle HTTP/2 connection is pinged, and how long a ping may go unanswered
/// before the connection counts as dead: one dead connection would otherwise hold every call
/// on it until the call's own timeout.
const PING_EVERY: Duration = Duration::from_secs(20);
const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// The clients calls go out on: one for HTTP/1.1, `connections` for HTTP/2.
#[derive(Debug, Clone)]
pub(super) struct Connections {
    clients: Arc<[reqwest::Client]>,
    next: Arc<AtomicUsize>,
}

impl Connections {
    /// Clients made by `builder` (each from a fresh builder: reqwest's builders are consumed),
    /// set up for `http`.
    pub(super) fn build(
        http: ModelHttp,
        builder: impl Fn() -> Result<reqwest::ClientBuilder, reqwest::Error>,
    ) -> Result<Self, reqwest::Error> {
        let clients = match http {
            ModelHttp::Http1 => vec![builder()?.http1_only().build()?],
            ModelHttp::Http2 { connections } => (0..connections.get())
                .map(|_| {
                    builder()?
                        .http2_prior_knowledge()
                        .http2_keep_alive_interval(PING_EVERY)
                        .http2_keep_alive_timeout(PING_TIMEOUT)
                        .build()
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        Ok(Self {
            clients: clients.into(),
            next: Arc::default(),
        })
    }

    /// The client the next call goes out on.
    pub(super) fn next(&self) -> &reqwest::Client {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len();
        &self.clients[i]
    }

    /// How many clients (connections, over HTTP/2) there are.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.clients.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_reads_both_versions_and_refuses_the_rest() {
        assert_eq!(ModelHttp::parse("http1", 0), Ok(ModelHttp::Http1));
        assert_eq!(
            ModelHttp::parse("http2", 3),
            Ok(ModelHttp::Http2 {
                connections: NonZeroUsize::new(3).unwrap_or(NonZeroUsize::MIN)
            })
        );
        assert!(ModelHttp::parse("http2", 0).is_err());
        let e = ModelHttp::parse("h2c", 4).unwrap_err();
        assert!(e.contains("\"h2c\" is not http1 or http2"), "{e}");
    }

    #[test]
    fn calls_are_spread_over_every_connection_in_turn() {
        let http = ModelHttp::parse("http2", 3).unwrap_or_default();
        let set = Connections::build(http, || crate::tls::http_client_builder(None))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(set.len(), 3);
        let picked: Vec<*const reqwest::Client> = (0..6).map(|_| set.next() as *const _).collect();
        assert_eq!(picked[0], picked[3]);
        assert_eq!(picked[1], picked[4]);
        assert_ne!(picked[0], picked[1]);
        assert_ne!(picked[1], picked[2]);
        let one = Connections::build(ModelHttp::Http1, || crate::tls::http_client_builder(None))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(one.len(), 1);
    }
}
