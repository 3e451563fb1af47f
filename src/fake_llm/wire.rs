//! The fake model's traffic: the connections it accepted, the Responses API requests that
//! came over HTTP/2 (it serves HTTP/1.1 and, by prior knowledge, HTTP/2) and those being
//! answered, so a test can see how the product's model client calls a server.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{FakeLlm, Inner};

/// The counts.
#[derive(Debug, Default)]
pub(super) struct Wire {
    connections: AtomicU64,
    http2_requests: AtomicU64,
}

impl Wire {
    /// A connection was accepted.
    pub(super) fn connected(&self) {
        self.connections.fetch_add(1, Ordering::SeqCst);
    }

    /// A request came over `version`.
    pub(super) fn request(&self, version: axum::http::Version) {
        if version == axum::http::Version::HTTP_2 {
            self.http2_requests.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl FakeLlm {
    /// Connections accepted since the server started.
    pub fn connections(&self) -> u64 {
        self.inner.wire.connections.load(Ordering::SeqCst)
    }

    /// Responses API requests (`POST /v1/responses`) that came over HTTP/2.
    pub fn http2_requests(&self) -> u64 {
        self.inner.wire.http2_requests.load(Ordering::SeqCst)
    }
}

/// Counts a request as being answered until dropped.
pub(super) struct Answering<'a>(&'a Inner);

impl<'a> Answering<'a> {
    /// A Responses API request that came over `version`.
    pub(super) fn start(inner: &'a Inner, version: axum::http::Version) -> Self {
        inner.wire.request(version);
        let now = inner.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        inner.peak_in_flight.fetch_max(now, Ordering::SeqCst);
        if !inner.options.forget_requests
            && let Ok(mut a) = inner.arrivals.lock()
        {
            a.push(inner.started.elapsed());
        }
        Self(inner)
    }
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
