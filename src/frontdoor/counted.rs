//! Counting every HTTP answer in the process's metrics: a tower layer put around each route (so
//! the route's template is known) that counts the request in flight and times it until its
//! answer's status and headers.
//!
//! Owns: what is recorded per answer. Must not: change a request or its answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::response::Response;

use crate::metrics::{Metrics, UNMATCHED_ROUTE};

/// Wraps a service so each of its answers is counted in [`Metrics::http_answered`].
#[derive(Clone)]
pub(crate) struct CountedLayer(pub(crate) Arc<Metrics>);

impl<S> tower::Layer<S> for CountedLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// A service whose answers are counted.
#[derive(Clone)]
pub(crate) struct Counted<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B> tower::Service<Request> for Counted<S>
where
    S: tower::Service<Request, Response = Response<B>>,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = CountedAnswer<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let route = request.extensions().get::<MatchedPath>().cloned();
        let method = request.method().clone();
        self.metrics
            .http_started(route.as_ref().map_or(UNMATCHED_ROUTE, MatchedPath::as_str));
        CountedAnswer {
            answer: self.inner.call(request),
            record: Some(Record {
                metrics: self.metrics.clone(),
                route,
                method,
                started: Instant::now(),
            }),
        }
    }
}

/// What is recorded once the answer is there — or, when the client goes away first and the
/// answer is dropped unfinished, as [`CLIENT_CLOSED`].
struct Record {
    metrics: Arc<Metrics>,
    route: Option<MatchedPath>,
    method: Method,
    started: Instant,
}

/// The status counted for a request whose client closed the connection before it was answered
/// (as nginx logs it): an abandoned synchronous wait or long-poll still shows.
pub(crate) const CLIENT_CLOSED: u16 = 499;

impl Record {
    fn count(&self, status: u16) {
        self.metrics.http_answered(
            self.route
                .as_ref()
                .map_or(UNMATCHED_ROUTE, MatchedPath::as_str),
            self.method.as_str(),
            status,
            self.started.elapsed(),
        );
    }
}

pin_project_lite::pin_project! {
    /// The wrapped service's answer, counted when it is ready (or dropped before).
    pub(crate) struct CountedAnswer<F> {
        #[pin]
        answer: F,
        record: Option<Record>,
    }

    impl<F> PinnedDrop for CountedAnswer<F> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(r) = this.project().record.take() {
                r.count(CLIENT_CLOSED);
            }
        }
    }
}

impl<F, B, E> Future for CountedAnswer<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = std::task::ready!(this.answer.poll(cx));
        if let Some(r) = this.record.take()
            && let Ok(response) = &answer
        {
            r.count(response.status().as_u16());
        }
        Poll::Ready(answer)
    }
}
