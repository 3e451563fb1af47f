//! The fake's background mode, as the live API has it: `POST /v1/responses` with
//! `"background": true` answers at once with the response `queued` (or, streamed, with its
//! events as they come); the response is `in_progress` until its answer is ready, then
//! `completed` (or what the reply says). `GET /v1/responses/{id}` retrieves it;
//! `?stream=true&starting_after=N` tells its events after sequence number `N`, each when its
//! time has come; `POST /v1/responses/{id}/cancel` stops it (again: no change). Responses are
//! kept until [`super::FakeLlm::expire_background`] forgets them (then `404`, as an expired
//! one is on the live API).
//!
//! Owns: the state of background responses. Must not: decide what an answer says.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Inner, error_response, stream};

/// How long a finished background response is kept (the live API keeps them for a while).
const KEPT_FOR: Duration = Duration::from_secs(600);

/// How long a new background response stays `queued`.
const QUEUED_FOR: Duration = Duration::from_millis(20);

/// Whether a request asks for background mode.
pub(super) fn asked(req: &Value) -> bool {
    req.get("background").and_then(Value::as_bool) == Some(true)
}

/// One background response.
struct Job {
    /// The finished object (its terminal status, output, usage).
    answer: Value,
    /// Its events, numbered, the last one terminal.
    events: Vec<Value>,
    created: Instant,
    /// How long its answer takes.
    takes: Duration,
    /// Cancelled at this moment (the response stops there).
    cancelled: Option<Instant>,
}

impl Job {
    fn done(&self, now: Instant) -> bool {
        now >= self.created + self.takes
    }

    /// When event `n` may be told: the first at once, the rest spread evenly over the time
    /// the answer takes, the last when it is ready.
    fn due(&self, n: usize) -> Instant {
        let last = self.events.len().saturating_sub(1).max(1);
        let frac = n.min(last) as f64 / last as f64;
        self.created + self.takes.mul_f64(frac)
    }

    /// The object as retrieving it now shows it.
    fn object(&self, now: Instant) -> Value {
        if self.cancelled.is_none() && self.done(now) {
            return self.answer.clone();
        }
        let mut head = self.answer.clone();
        let status = match self.cancelled {
            Some(_) => "cancelled",
            None if now < self.created + QUEUED_FOR => "queued",
            None => "in_progress",
        };
        head["status"] = json!(status);
        head["output"] = json!([]);
        head["usage"] = Value::Null;
        head["incomplete_details"] = Value::Null;
        head["error"] = Value::Null;
        head
    }
}

/// Every background response the fake holds, and the cancels it was sent.
#[derive(Default)]
pub(super) struct Background {
    jobs: Mutex<HashMap<String, Job>>,
    cancels: Mutex<Vec<String>>,
    retrievals: std::sync::atomic::AtomicU64,
}

impl Background {
    /// Holds `answer` as a background response ready after `takes`; answers the create call
    /// (the queued object, or its event stream from the start).
    pub(super) fn start(
        &self,
        answer: Value,
        takes: Duration,
        streamed: bool,
        inner: &Arc<Inner>,
    ) -> Response {
        let id = answer["id"].as_str().unwrap_or_default().to_string();
        let mut events = stream::sequence(&answer, pieces(inner));
        for (n, e) in events.iter_mut().enumerate() {
            e["sequence_number"] = json!(n);
        }
        if let Some(first) = events.first_mut() {
            first["response"]["status"] = json!("queued");
        }
        let job = Job {
            answer,
            events,
            created: Instant::now(),
            takes,
            cancelled: None,
        };
        let queued = job.object(job.created);
        if let Ok(mut jobs) = self.jobs.lock() {
            // Now and then, the old ones go: a fake left running does not grow without end.
            if jobs.len() % 1024 == 1023 {
                let now = Instant::now();
                jobs.retain(|_, j| now < j.created + j.takes + KEPT_FOR);
            }
            jobs.insert(id.clone(), job);
        }
        if streamed {
            return tell(inner.clone(), id, None);
        }
        Json(queued).into_response()
    }

    /// Forgets every background response (as the live API does after a while).
    pub(super) fn expire(&self) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.clear();
        }
    }

    /// The ids of the responses cancelled, in order (a repeated cancel once per call).
    pub(super) fn cancels(&self) -> Vec<String> {
        self.cancels.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// How many times a background response was retrieved (polled or its stream resumed).
    pub(super) fn retrievals(&self) -> u64 {
        self.retrievals.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn pieces(inner: &Inner) -> usize {
    match inner.options.stream_pieces {
        0 => 4,
        n => n,
    }
}

fn not_found(id: &str) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        &format!("Response with id '{id}' not found."),
        None,
        None,
    )
}

/// `GET /v1/responses/{id}` (`stream`, `starting_after`).
pub(super) async fn retrieve(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    inner
        .background
        .retrievals
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let object = inner
        .background
        .jobs
        .lock()
        .ok()
        .and_then(|jobs| jobs.get(&id).map(|j| j.object(Instant::now())));
    let Some(object) = object else {
        return not_found(&id);
    };
    if query.get("stream").map(String::as_str) != Some("true") {
        return Json(object).into_response();
    }
    let after = match query.get("starting_after").map(|v| v.parse::<u64>()) {
        None => None,
        Some(Ok(n)) => Some(n),
        Some(Err(_)) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "Invalid 'starting_after': expected an integer.",
                Some("starting_after"),
                None,
            );
        }
    };
    tell(inner, id, after)
}

/// `POST /v1/responses/{id}/cancel`: stops a response still running; idempotent.
pub(super) async fn cancel(State(inner): State<Arc<Inner>>, Path(id): Path<String>) -> Response {
    let now = Instant::now();
    let object = inner.background.jobs.lock().ok().and_then(|mut jobs| {
        let job = jobs.get_mut(&id)?;
        if job.cancelled.is_none() && !job.done(now) {
            job.cancelled = Some(now);
        }
        Some(job.object(now))
    });
    let Some(object) = object else {
        return not_found(&id);
    };
    if let Ok(mut c) = inner.background.cancels.lock() {
        c.push(id);
    }
    Json(object).into_response()
}

/// The events of response `id` after sequence number `after`, each when its time has come; the
/// stream ends after the terminal event, or where the response was cancelled or forgotten.
fn tell(inner: Arc<Inner>, id: String, after: Option<u64>) -> Response {
    let first = after.map_or(0, |n| n as usize + 1);
    let body = futures_util::stream::unfold((inner, id, first), |(inner, id, n)| async move {
        loop {
            let now = Instant::now();
            // The next event and when it is due, or the end.
            let next = {
                let jobs = inner.background.jobs.lock().ok()?;
                let job = jobs.get(&id)?;
                if job.cancelled.is_some_and(|at| at <= job.due(n)) {
                    return None;
                }
                let event = job.events.get(n)?.clone();
                (event, job.due(n))
            };
            let (event, due) = next;
            if due > now {
                tokio::time::sleep(due - now).await;
                continue;
            }
            let kind = event["type"].as_str().unwrap_or_default().to_string();
            let frame = format!("event: {kind}\ndata: {event}\n\n");
            return Some((Ok::<_, std::io::Error>(frame), (inner, id, n + 1)));
        }
    });
    let mut resp = (StatusCode::OK, Body::from_stream(body)).into_response();
    resp.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    resp
}
