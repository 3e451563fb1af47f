//! The HTTP connections a model client calls over: HTTP/1.1, one connection per call in
//! flight (kept for the next calls), or HTTP/2, every call a stream on one of as few
//! connections as the calls in flight need. By default (`auto`) the server chooses on
//! `https://` (ALPN: HTTP/2 if it offers it) and a plain `http://` server gets HTTP/1.1.
//!
//! The connections are the client's own: HTTP/2 ones on `h2` (`h2conn.rs`), HTTP/1.1 ones on
//! a codec of our own (`h1conn.rs`, `h1wire.rs`), so a waiting call holds its stream or its
//! connection (and no buffer), not a general client's pooled request. Over HTTP/2 each slot here is
//! one connection, each call takes a [`Lease`] on the least loaded one, and a connection is
//! added when every one carries `streams` calls (what a server allows at once,
//! `SETTINGS_MAX_CONCURRENT_STREAMS`, past which streams would wait unseen). A server offered
//! both versions that chooses HTTP/1.1 gets the call on the connection that learnt it, and
//! every call on HTTP/1.1 connections from then on. Each slot also has a reqwest client: for
//! background calls, and for every call when a proxy is set in the environment.
//!
//! Owns: which client a call goes out on, and how many calls each carries. Must not: know
//! what a call carries.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::h1conn::Pool;
use super::h2conn::Link;
use super::target::{Alpn, PING_EVERY, PING_TIMEOUT, Target};

/// Calls one HTTP/2 connection carries by default (`model.http2_streams`): what most servers
/// allow at once (`SETTINGS_MAX_CONCURRENT_STREAMS`).
pub const DEFAULT_STREAMS: NonZeroUsize = match NonZeroUsize::new(100) {
    Some(n) => n,
    None => NonZeroUsize::MIN,
};

/// How calls reach the model server (`model.http`, `model.http2_streams`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelHttp {
    /// The default: on `https://` the client offers both versions by ALPN and the server
    /// chooses (HTTP/2, with `streams` calls a connection, if it offers it; a server that
    /// answers with HTTP/1.1, or with no choice at all, gets HTTP/1.1); on `http://`, HTTP/1.1
    /// (nothing can be negotiated without TLS, and not every plain-HTTP server takes HTTP/2 by
    /// prior knowledge).
    Auto {
        /// Calls one connection carries before another is opened, when HTTP/2 was chosen.
        streams: NonZeroUsize,
    },
    /// HTTP/1.1: a connection per call in flight.
    Http1,
    /// HTTP/2: prior knowledge on `http://` (h2c); on `https://` the client asks for `h2` by
    /// ALPN and speaks HTTP/2 whatever the answer, so a server of HTTP/1.1 alone fails every
    /// call (as "could not reach the model server").
    Http2 {
        /// Calls one connection carries before another is opened.
        streams: NonZeroUsize,
    },
}

impl Default for ModelHttp {
    fn default() -> Self {
        Self::Auto {
            streams: DEFAULT_STREAMS,
        }
    }
}

impl ModelHttp {
    /// `auto`, `http1` or `http2` (the first and last with `streams` calls an HTTP/2
    /// connection), as the setting writes it.
    pub fn parse(text: &str, streams: usize) -> Result<Self, String> {
        let streams = || {
            NonZeroUsize::new(streams)
                .ok_or_else(|| "HTTP/2 needs at least one stream a connection".to_string())
        };
        match text {
            "auto" => Ok(Self::Auto {
                streams: streams()?,
            }),
            "http1" => Ok(Self::Http1),
            "http2" => Ok(Self::Http2 {
                streams: streams()?,
            }),
            other => Err(format!("{other:?} is not auto, http1 or http2")),
        }
    }

    /// What a client of a server reached `over_tls` (or not) speaks.
    fn wire(self, over_tls: bool) -> Wire {
        match self {
            Self::Http1 | Self::Auto { .. } if !over_tls => Wire::Http1,
            Self::Http1 => Wire::Http1,
            Self::Auto { streams } => Wire::Negotiated(streams),
            Self::Http2 { streams } => Wire::Http2(streams),
        }
    }
}

/// The versions one client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// HTTP/1.1 alone.
    Http1,
    /// HTTP/2 alone (prior knowledge on `http://`).
    Http2(NonZeroUsize),
    /// Both offered by ALPN; the server chooses.
    Negotiated(NonZeroUsize),
}

impl Wire {
    /// Calls a client carries before another is made; `None` when the client opens a
    /// connection per call itself.
    fn streams(self) -> Option<usize> {
        match self {
            Self::Http1 => None,
            Self::Http2(streams) | Self::Negotiated(streams) => Some(streams.get()),
        }
    }
}

/// Makes a client builder with the model client's timeouts and trust.
pub(super) type MakeBuilder =
    Arc<dyn Fn() -> Result<reqwest::ClientBuilder, reqwest::Error> + Send + Sync>;

/// One client (and, over HTTP/2, its connection of our own), and the calls it carries now.
#[derive(Debug, Clone)]
struct Slot {
    client: reqwest::Client,
    /// The HTTP/2 connection a call is sent on, when calls go out on connections of our own
    /// (HTTP/2 or a server's choice, no proxy); the client then carries the background calls.
    link: Option<Arc<Link>>,
    /// The HTTP/1.1 connections of our own (the first slot's, when calls may go out so).
    pool: Option<Arc<Pool>>,
    load: Arc<AtomicUsize>,
}

impl Slot {
    fn new(client: reqwest::Client, target: Option<&Arc<Target>>) -> Self {
        Self {
            client,
            link: target.map(|t| Arc::new(Link::new(Arc::clone(t)))),
            pool: None,
            load: Arc::default(),
        }
    }
}

/// The clients calls go out on: the first, made with the configuration, and those added while
/// every one carried its streams (HTTP/2 only).
#[derive(Clone)]
pub(super) struct Connections {
    first: Slot,
    more: Arc<Mutex<Vec<Slot>>>,
    /// Calls a client carries before another is made (HTTP/2; `None` for HTTP/1.1, whose one
    /// client opens a connection per call itself).
    streams: Option<usize>,
    wire: Wire,
    make: MakeBuilder,
    /// Where connections of our own go (`None`: every call goes through reqwest's client).
    target: Option<Arc<Target>>,
    /// Set once the server chose HTTP/1.1 by ALPN: calls go on the first slot's HTTP/1.1
    /// connections (a connection per call in flight) from then on.
    http1_chosen: Arc<AtomicBool>,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("clients", &self.len())
            .field("wire", &self.wire)
            .finish()
    }
}

impl Connections {
    /// Clients for `http` to a server reached `over_tls` (or not), each from a fresh builder
    /// of `make`, which must not have chosen a version. The first is made now, so a builder
    /// that cannot be built stops the configuration, not a call. `direct` makes the server as
    /// a target offering an ALPN choice, for calls on connections of our own; they are used
    /// unless a proxy is set in the environment (reqwest's client goes through the proxy).
    pub(super) fn build(
        http: ModelHttp,
        over_tls: bool,
        make: MakeBuilder,
        direct: impl Fn(Alpn) -> Result<Target, String>,
    ) -> Result<Self, reqwest::Error> {
        let wire = http.wire(over_tls);
        let own = !proxied(over_tls, |name| std::env::var_os(name));
        let target = |alpn| match direct(alpn) {
            Ok(target) => Some(Arc::new(target)),
            Err(e) => {
                tracing::warn!(error = %e, "model calls go through the general HTTP client");
                None
            }
        };
        let (streams_to, pooled_to) = match wire {
            _ if !own => (None, None),
            Wire::Http1 => (None, target(Alpn::Http1)),
            Wire::Http2(_) => (target(Alpn::H2), None),
            Wire::Negotiated(_) => (target(Alpn::Both), target(Alpn::Http1)),
        };
        let mut first = Slot::new(client(wire, &make)?, streams_to.as_ref());
        first.pool = pooled_to.map(|t| Arc::new(Pool::new(t)));
        Ok(Self {
            first,
            more: Arc::default(),
            streams: wire.streams(),
            wire,
            make,
            target: streams_to,
            http1_chosen: Arc::default(),
        })
    }

    /// The HTTP/1.1 connections of our own, if calls may go out on them.
    pub(super) fn pool(&self) -> Option<&Arc<Pool>> {
        self.first.pool.as_ref()
    }

    /// Notes that the server chose HTTP/1.1: calls go on HTTP/1.1 connections from now on.
    pub(super) fn note_http1_chosen(&self) {
        if !self.http1_chosen.swap(true, Ordering::Relaxed) {
            tracing::info!("the model server chose HTTP/1.1: a connection per call in flight");
        }
    }

    /// The client for the next call (the least loaded), counted as carrying it until the lease
    /// is dropped.
    pub(super) fn lease(&self) -> Lease {
        let Some(streams) = self
            .streams
            .filter(|_| !self.http1_chosen.load(Ordering::Relaxed))
        else {
            return Lease::on(&self.first, false);
        };
        let mut more = match self.more.lock() {
            Ok(more) => more,
            Err(poisoned) => poisoned.into_inner(),
        };
        let least = std::iter::once(&self.first)
            .chain(more.iter())
            .min_by_key(|s| s.load.load(Ordering::Relaxed))
            .unwrap_or(&self.first)
            .clone();
        if least.load.load(Ordering::Relaxed) < streams {
            return Lease::on(&least, true);
        }
        match client(self.wire, &self.make) {
            Ok(client) => {
                let slot = Slot::new(client, self.target.as_ref());
                more.push(slot.clone());
                Lease::on(&slot, true)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot open another HTTP/2 connection to the model server; the call shares a full one");
                Lease::on(&least, true)
            }
        }
    }

    /// How many clients (connections, over HTTP/2) there are.
    fn len(&self) -> usize {
        1 + self.more.lock().map_or(0, |m| m.len())
    }
}

fn client(wire: Wire, make: &MakeBuilder) -> Result<reqwest::Client, reqwest::Error> {
    let builder = make()?;
    let builder = match wire {
        Wire::Http1 => return builder.http1_only().build(),
        Wire::Http2(_) => builder.http2_prior_knowledge(),
        // reqwest offers `h2` and `http/1.1` by ALPN when no version is chosen.
        Wire::Negotiated(_) => builder,
    };
    // The pings apply to HTTP/2 connections alone.
    builder
        .http2_keep_alive_interval(PING_EVERY)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .build()
}

/// A call's hold on its client: the client counts it until this is dropped.
#[derive(Debug)]
pub(super) struct Lease(Slot, bool);

impl Lease {
    /// A hold on `slot`, whose own connection the call may go out on if `streams`.
    fn on(slot: &Slot, streams: bool) -> Self {
        slot.load.fetch_add(1, Ordering::Relaxed);
        Self(slot.clone(), streams)
    }

    /// The client to send the call on.
    pub(super) fn client(&self) -> &reqwest::Client {
        &self.0.client
    }

    /// The HTTP/2 connection of our own to send the call on, if calls go out so.
    pub(super) fn link(&self) -> Option<&Link> {
        self.0.link.as_deref().filter(|_| self.1)
    }

    /// The HTTP/1.1 connections of our own to send the call on, if calls go out so.
    pub(super) fn pool(&self) -> Option<&Arc<Pool>> {
        self.0.pool.as_ref().filter(|_| !self.1)
    }
}

/// Whether the environment names a proxy for the server's scheme (as reqwest's client reads
/// it: `HTTPS_PROXY` or `HTTP_PROXY`, either case, or `ALL_PROXY`).
fn proxied(over_tls: bool, var: impl Fn(&str) -> Option<std::ffi::OsString>) -> bool {
    let names: &[&str] = if over_tls {
        &["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]
    } else {
        &["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
    };
    names
        .iter()
        .any(|name| var(name).is_some_and(|v| !v.is_empty()))
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.load.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn connections(http: ModelHttp) -> Connections {
        Connections::build(
            http,
            true,
            Arc::new(|| crate::tls::client_builder(None)),
            no_link,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Leases are counted the same with connections of our own or without.
    fn no_link(_: Alpn) -> Result<Target, String> {
        Err("not in this test".into())
    }

    #[test]
    fn the_setting_reads_the_three_choices_and_refuses_the_rest() {
        assert_eq!(ModelHttp::parse("http1", 0), Ok(ModelHttp::Http1));
        assert_eq!(
            ModelHttp::parse("auto", 7),
            Ok(ModelHttp::Auto {
                streams: NonZeroUsize::new(7).unwrap_or(NonZeroUsize::MIN)
            })
        );
        assert!(ModelHttp::parse("auto", 0).is_err());
        assert_eq!(
            ModelHttp::default(),
            ModelHttp::Auto {
                streams: DEFAULT_STREAMS
            }
        );
        assert_eq!(DEFAULT_STREAMS.get(), 100);
        assert_eq!(
            ModelHttp::parse("http2", 3),
            Ok(ModelHttp::Http2 {
                streams: NonZeroUsize::new(3).unwrap_or(NonZeroUsize::MIN)
            })
        );
        assert!(ModelHttp::parse("http2", 0).is_err());
        let e = ModelHttp::parse("h2c", 4).unwrap_err();
        assert!(e.contains("\"h2c\" is not auto, http1 or http2"), "{e}");
    }

    #[test]
    fn a_connection_is_added_when_every_one_carries_its_streams_and_the_least_loaded_is_used() {
        let set = connections(ModelHttp::parse("http2", 2).unwrap_or_default());
        assert_eq!(set.len(), 1);
        let (a, b) = (set.lease(), set.lease());
        assert!(std::ptr::eq(a.0.load.as_ref(), b.0.load.as_ref()));
        assert_eq!(set.len(), 1, "two calls fit on one connection");
        let c = set.lease();
        assert_eq!(set.len(), 2, "a third opens another");
        assert!(!std::ptr::eq(a.0.load.as_ref(), c.0.load.as_ref()));
        drop((a, b));
        // The first is empty again: the next call goes there, not beside `c`.
        let d = set.lease();
        assert_eq!(d.0.load.load(Ordering::Relaxed), 1);
        assert!(!std::ptr::eq(c.0.load.as_ref(), d.0.load.as_ref()));
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn auto_speaks_http1_without_tls_and_lets_a_tls_server_choose() {
        let two = NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN);
        let auto = ModelHttp::Auto { streams: two };
        assert_eq!(auto.wire(false), Wire::Http1);
        assert_eq!(auto.wire(true), Wire::Negotiated(two));
        assert_eq!(ModelHttp::Http1.wire(true), Wire::Http1);
        let http2 = ModelHttp::Http2 { streams: two };
        assert_eq!(http2.wire(false), Wire::Http2(two));
        assert_eq!(http2.wire(true), Wire::Http2(two));
        // Without TLS: one client, a connection per call, as `http1`.
        let plain = Connections::build(
            auto,
            false,
            Arc::new(|| crate::tls::client_builder(None)),
            no_link,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let leases: Vec<Lease> = (0..5).map(|_| plain.lease()).collect();
        assert_eq!((plain.len(), plain.streams), (1, None));
        drop(leases);
        // Over TLS the server may choose HTTP/2: calls are spread as its streams allow.
        let tls = connections(auto);
        let leases: Vec<Lease> = (0..3).map(|_| tls.lease()).collect();
        assert_eq!(tls.len(), 2, "a third call opens another client");
        drop(leases);
    }

    #[test]
    fn a_proxy_for_the_servers_scheme_keeps_calls_on_the_pooled_client() {
        let set = |names: &'static [&'static str]| {
            move |name: &str| {
                names
                    .contains(&name)
                    .then(|| std::ffi::OsString::from("http://p:3128"))
            }
        };
        assert!(proxied(true, set(&["HTTPS_PROXY"])));
        assert!(proxied(true, set(&["all_proxy"])));
        assert!(
            !proxied(true, set(&["HTTP_PROXY"])),
            "a proxy for http:// alone"
        );
        assert!(proxied(false, set(&["http_proxy"])));
        assert!(!proxied(false, set(&[])));
        assert!(
            !proxied(true, |_: &str| Some(std::ffi::OsString::new())),
            "set but empty"
        );
    }

    /// Credentials in the endpoint's URL are sent as basic auth by the general client alone:
    /// such an endpoint gets every call through it (its own connections would have put them
    /// in `Host`).
    #[test]
    fn an_endpoint_with_credentials_in_its_url_keeps_calls_on_the_general_client() {
        let make: MakeBuilder = Arc::new(|| crate::tls::client_builder(None));
        for (url, own) in [
            ("http://models.example/v1/responses", true),
            ("http://user:secret@models.example/v1/responses", false),
            ("http://user@models.example/v1/responses", false),
        ] {
            let target = |alpn: Alpn| {
                let url = reqwest::Url::parse(url).unwrap_or_else(|e| panic!("{e}"));
                Target::new(
                    &url,
                    crate::tls::client_config(None),
                    alpn,
                    Duration::from_secs(1),
                )
            };
            let set = Connections::build(ModelHttp::default(), false, Arc::clone(&make), target)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(set.lease().pool().is_some(), own, "{url}");
            assert!(set.lease().link().is_none(), "{url}");
        }
    }

    #[test]
    fn calls_go_on_connections_of_our_own_in_the_version_the_setting_allows() {
        let target = |alpn: Alpn| {
            let url = reqwest::Url::parse("https://models.example/v1/responses")
                .unwrap_or_else(|e| panic!("{e}"));
            Target::new(
                &url,
                crate::tls::client_config(None),
                alpn,
                Duration::from_secs(1),
            )
        };
        let make: MakeBuilder = Arc::new(|| crate::tls::client_builder(None));
        // (setting, on a stream of our own, on an HTTP/1.1 connection of our own once the
        // server chose HTTP/1.1)
        for (http, streams, then_pooled) in [
            (ModelHttp::default(), true, true),
            (
                ModelHttp::parse("http2", 4).unwrap_or_default(),
                true,
                false,
            ),
            (ModelHttp::Http1, false, true),
        ] {
            let set = Connections::build(http, true, Arc::clone(&make), target)
                .unwrap_or_else(|e| panic!("{e}"));
            let lease = set.lease();
            assert_eq!(lease.link().is_some(), streams, "{http:?}");
            assert_eq!(lease.pool().is_some(), !streams, "{http:?}");
            set.note_http1_chosen();
            let lease = set.lease();
            assert!(lease.link().is_none(), "{http:?}");
            assert_eq!(lease.pool().is_some(), then_pooled, "{http:?}");
            assert_eq!(
                lease.pool().map(|p| p.target().alpn()),
                then_pooled.then_some(Alpn::Http1),
                "{http:?}"
            );
        }
    }

    #[test]
    fn http1_keeps_one_client_whatever_the_calls_in_flight() {
        let set = connections(ModelHttp::Http1);
        let leases: Vec<Lease> = (0..50).map(|_| set.lease()).collect();
        assert_eq!(set.len(), 1);
        assert_eq!(leases[0].0.load.load(Ordering::Relaxed), 50);
        drop(leases);
        assert_eq!(set.lease().0.load.load(Ordering::Relaxed), 1);
    }

    /// A server that speaks HTTP/1.1 alone answers the HTTP/2 client's preface with an
    /// HTTP/1.1 response: the call fails, as a server that cannot be reached, not as an answer.
    #[tokio::test]
    async fn an_http2_call_to_a_server_of_http1_alone_fails_as_unreachable() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            }
        });
        let llm = super::super::LlmClient::with_ca(
            &format!("http://{addr}/v1"),
            None,
            Duration::from_secs(2),
            Duration::from_secs(2),
            0,
            None,
            ModelHttp::parse("http2", 100).unwrap_or_default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let body = crate::state::WireRequest::whole(&br#"{"model":"m","input":"hi"}"#[..]);
        match llm.create_response("m", &body).await {
            Err(super::super::LlmError::Unavailable { message, .. }) => {
                assert!(
                    message.contains("could not reach the model server"),
                    "{message}"
                );
            }
            other => panic!("an unreachable server, not {other:?}"),
        }
    }
}
