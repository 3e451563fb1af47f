//! Live output of a running turn (AGN-034 §4.7, `"streaming": true`): the model's text as it
//! is written and progress notes, batched and handed to an [`LiveOutlet`] that delivers them
//! to the session's live subscribers only. Live events are never stored, never enter the
//! durable reply queue, the turn record or the job queue, and may be lost; the turn's result
//! is what counts.
//!
//! Each event is one JSON object `{sessionId, turnId, kind, index, …}`: `kind` is `delta`
//! (with `text`, and `call` naming the model call on its first text and again at most once a
//! second) or `progress` (with `message`); `index` counts a turn run's events from 0.
//!
//! Owns: batching (text goes out at once when nothing went out in the last `flush_every`,
//! else when that time is up or `max_chars` are waiting: the first words are not held back,
//! and a fast model does not mean one message per token) and the event shape. Must not: know the broker (the outlet does).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::contract::{SessionId, TurnId};

/// Delivers a session's live events (transient, best effort).
#[async_trait::async_trait]
pub trait LiveOutlet: Send + Sync + 'static {
    /// Publishes one event of `turn` of `session` to its watchers and to the front door at
    /// `reply_to` (the one waiting for the turn, when there is one); failures are the outlet's
    /// to log.
    async fn publish_live(
        &self,
        session: &SessionId,
        turn: &TurnId,
        reply_to: Option<&str>,
        event: Vec<u8>,
    );
}

/// How live text is batched.
#[derive(Debug, Clone, Copy)]
pub struct LiveSettings {
    /// The longest text waits before it is sent.
    pub flush_every: Duration,
    /// Text sent at once when this many characters are waiting.
    pub max_chars: usize,
}

impl Default for LiveSettings {
    fn default() -> Self {
        Self {
            flush_every: Duration::from_millis(50),
            max_chars: 512,
        }
    }
}

/// One live event, as published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveEvent {
    /// The session.
    pub session_id: String,
    /// The turn.
    pub turn_id: String,
    /// Its position in the turn run's events, from 0.
    pub index: u64,
    /// What it says.
    #[serde(flatten)]
    pub body: LiveBody,
}

/// What a live event says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum LiveBody {
    /// Answer text, in order.
    Delta {
        /// The text.
        text: String,
        /// For the text of a background model call: where in the call's event stream it
        /// reaches (a worker that re-attaches to the call resumes after it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reached: Option<Reached>,
        /// On the first text of each model call, and again at most every
        /// [`CALL_NAMED_EVERY`] (for a watcher that came late): the call it comes from (what
        /// a watcher shows as the call in flight until the turn's record lists it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call: Option<CallStarted>,
    },
    /// Something the client may show (a server tool runs, a model call restarts).
    Progress {
        /// What happens.
        message: String,
    },
}

/// The event of a background model call that a live text reaches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reached {
    /// The model response.
    pub response_id: String,
    /// The `sequence_number` of its last event in the text.
    pub sequence: u64,
}

/// A model call that started, as the first text it writes carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallStarted {
    /// The model asked.
    pub model: String,
    /// The agent context it was asked in.
    pub agent_context: String,
    /// The turn's run that makes it, from 1.
    pub attempt: u32,
    /// When it started, in milliseconds after the turn was accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ms: Option<u64>,
}

/// How often a model call's text names the call again after its first text.
pub const CALL_NAMED_EVERY: Duration = Duration::from_secs(1);

/// Which text names its model call: the first of each call, then one every
/// [`CALL_NAMED_EVERY`].
#[derive(Default)]
struct Naming {
    current: Option<CallStarted>,
    named_at: Option<tokio::time::Instant>,
}

impl Naming {
    fn started(&mut self, call: CallStarted) {
        self.current = Some(call);
        self.named_at = None;
    }

    /// The call a text sent now names, if it names one.
    fn for_text(&mut self) -> Option<CallStarted> {
        let now = tokio::time::Instant::now();
        let due = self.named_at.is_none_or(|at| now >= at + CALL_NAMED_EVERY);
        let call = self.current.as_ref().filter(|_| due).cloned();
        if call.is_some() {
            self.named_at = Some(now);
        }
        call
    }
}

enum Msg {
    Text(String, Option<Reached>),
    Call(CallStarted),
    Progress(String),
    Rerun(u32),
    Resume(u32),
}

/// Indices of the `n`-th run of a turn start at `(n - 1) * RUN_STRIDE`, so they keep rising
/// when a turn runs again after a crash or a retry.
pub const RUN_STRIDE: u64 = 1 << 20;

/// The live output of one turn run.
pub struct LiveTurn {
    tx: Mutex<Option<mpsc::UnboundedSender<Msg>>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for LiveTurn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveTurn").finish_non_exhaustive()
    }
}

impl LiveTurn {
    /// Starts batching the live output of `turn` of `session` into `outlet`.
    pub fn start(
        outlet: Arc<dyn LiveOutlet>,
        session: &SessionId,
        turn: &TurnId,
        reply_to: Option<&str>,
        settings: LiveSettings,
    ) -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(batch(
            outlet,
            (session.clone(), turn.clone()),
            reply_to.map(str::to_string),
            settings,
            rx,
        ));
        Arc::new(Self {
            tx: Mutex::new(Some(tx)),
            task: Mutex::new(Some(task)),
        })
    }

    fn send(&self, msg: Msg) {
        if let Ok(tx) = self.tx.lock()
            && let Some(tx) = tx.as_ref()
        {
            let _ = tx.send(msg);
        }
    }

    /// Answer text (never function-call arguments).
    pub fn text(&self, text: &str) {
        if !text.is_empty() {
            self.send(Msg::Text(text.to_string(), None));
        }
    }

    /// Answer text of a background model call, reaching its event `reached`.
    pub fn text_reaching(&self, text: &str, reached: Reached) {
        if !text.is_empty() {
            self.send(Msg::Text(text.to_string(), Some(reached)));
        }
    }

    /// A model call starts: its first text carries `call` (text of an earlier call that is
    /// still waiting goes out first, without it).
    pub fn call_started(&self, call: CallStarted) {
        self.send(Msg::Call(call));
    }

    /// A progress note; text waiting is sent first.
    pub fn progress(&self, message: impl Into<String>) {
        self.send(Msg::Progress(message.into()));
    }

    /// Says the turn runs again (its `attempt`-th run, from 1): a progress note, and indices
    /// from `(attempt - 1) * RUN_STRIDE` on. Text of an earlier run is replaced by what follows.
    pub fn rerun(&self, attempt: u32) {
        if attempt > 1 {
            self.send(Msg::Rerun(attempt));
        }
    }

    /// Says the turn goes on in its `attempt`-th run (from 1) after the client ran its tools:
    /// indices from `(attempt - 1) * RUN_STRIDE` on, so they stay above the earlier runs' (a
    /// client's `Last-Event-ID` keeps its meaning), with nothing replaced.
    pub fn resume(&self, attempt: u32) {
        if attempt > 1 {
            self.send(Msg::Resume(attempt));
        }
    }

    /// Sends what is waiting and returns once every event is published (before the turn's
    /// result is, so subscribers see the text first).
    pub async fn finish(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

async fn batch(
    outlet: Arc<dyn LiveOutlet>,
    (session, turn): (SessionId, TurnId),
    reply_to: Option<String>,
    settings: LiveSettings,
    mut rx: mpsc::UnboundedReceiver<Msg>,
) {
    let to = reply_to.as_deref();
    let mut index = 0u64;
    let mut waiting = String::new();
    // Where the waiting text reaches in its background call, if it comes from one.
    let mut reached: Option<Reached> = None;
    // The model call the text comes from, and when a text last named it.
    let mut call = Naming::default();
    let mut deadline = None;
    // When text last went out; text arriving later than `flush_every` after it goes at once.
    let mut last_sent: Option<tokio::time::Instant> = None;
    let publish = |index: &mut u64, body: LiveBody| {
        let event = LiveEvent {
            session_id: session.client_id().to_string(),
            turn_id: turn.to_string(),
            index: *index,
            body,
        };
        *index += 1;
        serde_json::to_vec(&event).unwrap_or_default()
    };
    loop {
        let next = match deadline {
            None => rx.recv().await,
            Some(at) => tokio::select! {
                m = rx.recv() => m,
                _ = tokio::time::sleep_until(at) => {
                    let text = std::mem::take(&mut waiting);
                    let body = publish(&mut index, LiveBody::Delta { text, reached: reached.take(), call: call.for_text() });
                    outlet.publish_live(&session, &turn, to, body).await;
                    last_sent = Some(tokio::time::Instant::now());
                    deadline = None;
                    continue;
                }
            },
        };
        let flush_text = |waiting: &mut String,
                          reached: &mut Option<Reached>,
                          call: &mut Naming,
                          index: &mut u64| {
            (!waiting.is_empty()).then(|| {
                let text = std::mem::take(waiting);
                publish(
                    index,
                    LiveBody::Delta {
                        text,
                        reached: reached.take(),
                        call: call.for_text(),
                    },
                )
            })
        };
        match next {
            Some(Msg::Text(t, at)) => {
                waiting.push_str(&t);
                if at.is_some() {
                    reached = at;
                }
                let now = tokio::time::Instant::now();
                let quiet = last_sent.is_none_or(|at| now >= at + settings.flush_every);
                if (quiet && deadline.is_none()) || waiting.chars().count() >= settings.max_chars {
                    if let Some(body) =
                        flush_text(&mut waiting, &mut reached, &mut call, &mut index)
                    {
                        outlet.publish_live(&session, &turn, to, body).await;
                    }
                    last_sent = Some(now);
                    deadline = None;
                } else if deadline.is_none() {
                    deadline = Some(last_sent.map_or(now, |at| at + settings.flush_every));
                }
            }
            Some(Msg::Call(started)) => {
                // Text still waiting is the earlier call's: it goes out first, as it is.
                if let Some(body) = flush_text(&mut waiting, &mut reached, &mut call, &mut index) {
                    outlet.publish_live(&session, &turn, to, body).await;
                    last_sent = Some(tokio::time::Instant::now());
                }
                deadline = None;
                call.started(started);
            }
            Some(Msg::Resume(attempt)) => {
                index = index.max(u64::from(attempt - 1) * RUN_STRIDE);
            }
            Some(Msg::Rerun(attempt)) => {
                index = index.max(u64::from(attempt - 1) * RUN_STRIDE);
                let message = format!(
                    "the turn runs again (run {attempt}): the text streamed so far is replaced by what follows"
                );
                let body = publish(&mut index, LiveBody::Progress { message });
                outlet.publish_live(&session, &turn, to, body).await;
            }
            Some(Msg::Progress(message)) => {
                if let Some(body) = flush_text(&mut waiting, &mut reached, &mut call, &mut index) {
                    outlet.publish_live(&session, &turn, to, body).await;
                }
                deadline = None;
                let body = publish(&mut index, LiveBody::Progress { message });
                outlet.publish_live(&session, &turn, to, body).await;
            }
            None => {
                if let Some(body) = flush_text(&mut waiting, &mut reached, &mut call, &mut index) {
                    outlet.publish_live(&session, &turn, to, body).await;
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Collect(Mutex<Vec<LiveEvent>>);

    #[async_trait::async_trait]
    impl LiveOutlet for Collect {
        async fn publish_live(
            &self,
            _session: &SessionId,
            _turn: &TurnId,
            _reply_to: Option<&str>,
            event: Vec<u8>,
        ) {
            self.0
                .lock()
                .unwrap()
                .push(serde_json::from_slice(&event).unwrap());
        }
    }

    fn ids() -> (SessionId, TurnId) {
        (SessionId::parse("s").unwrap(), TurnId::parse("t").unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn text_is_batched_by_time_and_size_and_progress_keeps_the_order() {
        let out = Arc::new(Collect::default());
        let (s, t) = ids();
        let live = LiveTurn::start(
            out.clone(),
            &s,
            &t,
            None,
            LiveSettings {
                flush_every: Duration::from_millis(50),
                max_chars: 10,
            },
        );
        // The first text goes at once; what follows within the interval waits for it.
        live.text("Hel");
        tokio::time::sleep(Duration::from_millis(1)).await;
        live.text("lo");
        live.text(" you");
        tokio::time::sleep(Duration::from_millis(60)).await;
        // A burst over the size bound goes at once, whatever the interval.
        live.text("0123456789abc");
        live.text("de");
        live.progress("running a tool");
        live.text("end");
        live.finish().await;
        let got = out.0.lock().unwrap().clone();
        let shown: Vec<(u64, LiveBody)> = got.into_iter().map(|e| (e.index, e.body)).collect();
        let delta = |t: &str| LiveBody::Delta {
            text: t.into(),
            reached: None,
            call: None,
        };
        assert_eq!(
            shown,
            vec![
                (0, delta("Hel")),
                (1, delta("lo you")),
                (2, delta("0123456789abc")),
                (3, delta("de")),
                (
                    4,
                    LiveBody::Progress {
                        message: "running a tool".into()
                    }
                ),
                (5, delta("end")),
            ]
        );
    }

    #[test]
    fn events_have_exactly_the_documented_keys() {
        let e = LiveEvent {
            session_id: "s".into(),
            turn_id: "t".into(),
            index: 3,
            body: LiveBody::Delta {
                text: "x".into(),
                reached: None,
                call: None,
            },
        };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"sessionId": "s", "turnId": "t", "index": 3, "kind": "delta", "text": "x"})
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_text_of_each_model_call_names_the_call() {
        let out = Arc::new(Collect::default());
        let (s, t) = ids();
        let live = LiveTurn::start(out.clone(), &s, &t, None, LiveSettings::default());
        let call = |model: &str, start_ms: u64| CallStarted {
            model: model.into(),
            agent_context: "default".into(),
            attempt: 1,
            start_ms: Some(start_ms),
        };
        live.call_started(call("m1", 5));
        live.text("first ");
        live.text("words");
        // The second call starts while the first call's text waits: that goes out first,
        // without the second call's name.
        live.call_started(call("m2", 90));
        live.text("second");
        // A call that writes no text names nothing; the next one's text names the next one.
        live.call_started(call("m3", 120));
        live.call_started(call("m4", 130));
        tokio::time::sleep(Duration::from_millis(60)).await;
        live.text("fourth");
        // A watcher that subscribed late learns of the call within a second.
        for word in ["a", "b", "c"] {
            tokio::time::sleep(Duration::from_millis(450)).await;
            live.text(word);
        }
        live.finish().await;
        let got: Vec<(String, Option<String>)> = out
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|e| match &e.body {
                LiveBody::Delta { text, call, .. } => {
                    (text.clone(), call.as_ref().map(|c| c.model.clone()))
                }
                other => panic!("only text was sent: {other:?}"),
            })
            .collect();
        let named = |t: &str, m: Option<&str>| (t.to_string(), m.map(str::to_string));
        assert_eq!(
            got,
            [
                named("first ", Some("m1")),
                named("words", None),
                named("second", Some("m2")),
                named("fourth", Some("m4")),
                named("a", None),
                named("b", None),
                named("c", Some("m4")),
            ]
        );
        let first = serde_json::to_value(&out.0.lock().unwrap()[0]).unwrap();
        assert_eq!(
            first["call"],
            serde_json::json!({"model": "m1", "agentContext": "default", "attempt": 1, "startMs": 5})
        );
    }
}
