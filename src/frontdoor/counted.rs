//! Counting every HTTP answer in the process's metrics: a tower layer put around each route (so
//! the route's template is known) that times the request until its answer's status and headers.
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

/// What is recorded once the answer is there.
struct Record {
    metrics: Arc<Metrics>,
    route: Option<MatchedPath>,
    method: Method,
    started: Instant,
}

pin_project_lite::pin_project! {
    /// The wrapped service's answer, counted when it is ready.
    pub(crate) struct CountedAnswer<F> {
        #[pin]
        answer: F,
        record: Option<Record>,
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
        if let (Ok(response), Some(r)) = (&answer, this.record.take()) {
            r.metrics.http_answered(
                r.route
                    .as_ref()
                    .map_or(UNMATCHED_ROUTE, MatchedPath::as_str),
                r.method.as_str(),
                response.status().as_u16(),
                r.started.elapsed(),
            );
        }
        Poll::Ready(answer)
    }
}
