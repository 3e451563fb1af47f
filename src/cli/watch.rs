//! `aptix watch`: a session's results (and a streaming turn's text) as they are published, over
//! the API's Server-Sent Events, followed through a front door that restarts or a network that
//! drops: the command subscribes again with `Last-Event-ID` and prints what settled meanwhile.
//!
//! Owns: following one session from the command line. Must not: reach RabbitMQ or Redis.

use std::collections::HashSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::client::{ApiClient, LONGEST_PAUSE, Lost, SseEvent, pauses};
use super::serve::stop_on_signal;

/// Arguments of `aptix watch`.
#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// The session id.
    pub session_id: String,
    /// The API's base URL.
    #[arg(long, env = "APTIX_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Bearer token.
    #[arg(long, env = "APTIX_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Stop after this many events.
    #[arg(long)]
    pub count: Option<usize>,
    /// How long to keep trying to subscribe (again) while the API cannot be reached or the
    /// stream is lost (the front door restarting, the network dropping), in seconds; 0 ends
    /// the command at once.
    #[arg(long, default_value_t = 300)]
    pub retry_for_secs: u64,
}

/// `aptix watch`.
pub async fn watch(args: WatchArgs) -> anyhow::Result<ExitCode> {
    let WatchArgs {
        session_id,
        url,
        token,
        count,
        retry_for_secs,
    } = args;
    let client = ApiClient::new(&url, token);
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let patience = Duration::from_secs(retry_for_secs);
    tokio::select! {
        _ = shutdown.cancelled() => Ok(ExitCode::SUCCESS),
        r = follow(&client, &session_id, count, patience) => r,
    }
}

/// A turn's settled status as the session's listing shows it: `(turnId, status)`.
type Listed = (String, String);

/// A result as printed: `(turnId, status, completedAt)` (a turn that waits for client tools
/// twice settles twice with the same status, at different times).
type Shown = (String, String, String);

/// What the command has shown and where the stream stands.
struct Follower {
    /// Results printed, against `count`.
    seen: usize,
    count: Option<usize>,
    /// A streaming turn's text was printed and its line is still open.
    texted: bool,
    /// The id of the last event received, sent as `Last-Event-ID` on a new subscription.
    last_id: Option<String>,
    /// The turns over for good when the command started: not news.
    before: HashSet<Listed>,
    /// Results printed, and those of turns that waited for client tools when it started.
    shown: HashSet<Shown>,
}

impl Follower {
    /// Shows one event; `false` once `count` results have been printed.
    fn show(&mut self, event: &SseEvent) -> bool {
        use std::io::Write as _;
        if event.id.is_some() {
            self.last_id.clone_from(&event.id);
        }
        let value: Value = serde_json::from_str(&event.data).unwrap_or_default();
        match event.name.as_str() {
            "delta" => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(value["text"].as_str().unwrap_or_default().as_bytes());
                let _ = out.flush();
                self.texted = true;
                true
            }
            "progress" => {
                eprintln!("[{}]", value["message"].as_str().unwrap_or_default());
                true
            }
            _ => {
                // The last turn's result, sent again on a new subscription, or a result the
                // catch-up printed first: shown already.
                if let Some(key) = shown_key(&value)
                    && !self.shown.insert(key)
                {
                    return true;
                }
                self.end_text_line();
                println!("{}", event.data);
                self.seen += 1;
                self.count.is_none_or(|c| self.seen < c)
            }
        }
    }

    /// Ends a streamed turn's open line of text, if there is one.
    fn end_text_line(&mut self) {
        if std::mem::take(&mut self.texted) {
            println!();
        }
    }
}

/// `(turnId, status, completedAt)` of a turn status view.
fn shown_key(view: &Value) -> Option<Shown> {
    Some((
        view["turnId"].as_str()?.to_string(),
        view["status"].as_str()?.to_string(),
        view["completedAt"].as_str().unwrap_or_default().to_string(),
    ))
}

/// The session's settled turns, from its listing (none for a session that does not exist
/// yet). `Err(Lost)` when the API cannot answer now.
async fn settled_turns(
    client: &ApiClient,
    session_id: &str,
) -> anyhow::Result<Result<Vec<Listed>, Lost>> {
    let body = match fetch(client, &format!("/v1/sessions/{session_id}")).await? {
        Ok(Some(body)) => body,
        Ok(None) => return Ok(Ok(Vec::new())),
        Err(lost) => return Ok(Err(lost)),
    };
    let turns = body["result"]["turns"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    Ok(Ok(turns
        .iter()
        .filter_map(|t| Some((t["turnId"].as_str()?.into(), t["status"].as_str()?.into())))
        .filter(|(_, status): &Listed| status != "queued" && status != "running")
        .collect()))
}

/// Notes the session's results from before the command started, which are not news: a turn
/// over for good by its status; a turn that waits for client tools by its result's time (it
/// may settle again, after a continuation).
async fn note_earlier(
    client: &ApiClient,
    session_id: &str,
    follower: &mut Follower,
) -> anyhow::Result<Result<(), Lost>> {
    let settled = match settled_turns(client, session_id).await? {
        Ok(s) => s,
        Err(lost) => return Ok(Err(lost)),
    };
    for listed in settled {
        if listed.1 != "awaiting_client_tools" {
            follower.before.insert(listed);
            continue;
        }
        match turn_view(client, session_id, &listed.0).await? {
            Ok(view) => follower.shown.extend(view.as_ref().and_then(shown_key)),
            Err(lost) => return Ok(Err(lost)),
        }
    }
    Ok(Ok(()))
}

/// A JSON answer of the API: `None` for a 404 (a session not created yet, a turn expired
/// since the session was listed), `Err(Lost)` when the API cannot answer now; any other
/// refusal is an error.
async fn fetch(client: &ApiClient, path: &str) -> anyhow::Result<Result<Option<Value>, Lost>> {
    match client.get(path).await {
        Err(e) => Ok(Err(Lost(format!("{e:#}")))),
        Ok((200, answer)) => Ok(Ok(Some(answer))),
        Ok((404, _)) => Ok(Ok(None)),
        Ok((status @ 502..=504, _)) => Ok(Err(Lost(format!("answers {status}")))),
        Ok((status, body)) => anyhow::bail!("GET {path} answered {status}: {body}"),
    }
}

/// A turn's status view (`None`: it no longer exists).
async fn turn_view(
    client: &ApiClient,
    session_id: &str,
    turn_id: &str,
) -> anyhow::Result<Result<Option<Value>, Lost>> {
    let path = format!("/v1/sessions/{session_id}/turns/{turn_id}");
    Ok(fetch(client, &path)
        .await?
        .map(|answer| answer.map(|a| a["result"].clone())))
}

/// Prints the results that settled while no stream was open: each settled turn's latest
/// result, unless it was printed or is from before the command started.
/// `false` once `count` results have been printed.
async fn catch_up(
    client: &ApiClient,
    session_id: &str,
    follower: &mut Follower,
) -> anyhow::Result<Result<bool, Lost>> {
    let settled = match settled_turns(client, session_id).await? {
        Ok(s) => s,
        Err(lost) => return Ok(Err(lost)),
    };
    for listed in settled {
        if follower.before.contains(&listed) {
            continue;
        }
        let view = match turn_view(client, session_id, &listed.0).await? {
            Ok(Some(view)) => view,
            Ok(None) => continue,
            Err(lost) => return Ok(Err(lost)),
        };
        let event = SseEvent {
            name: "turn".into(),
            id: None,
            data: view.to_string(),
        };
        if !follower.show(&event) {
            return Ok(Ok(false));
        }
    }
    Ok(Ok(true))
}

/// Follows the session until `count` results were printed (or for good), trying for up to
/// `patience` each time the API cannot be reached or the stream is lost.
async fn follow(
    client: &ApiClient,
    session_id: &str,
    count: Option<usize>,
    patience: Duration,
) -> anyhow::Result<ExitCode> {
    let mut follower = Follower {
        seen: 0,
        count,
        texted: false,
        last_id: None,
        before: HashSet::new(),
        shown: HashSet::new(),
    };
    // Whether the session's earlier results were read, whether it was subscribed to once, and
    // since when the API has been out of reach.
    let (mut read_before, mut started) = (false, false);
    let mut lost_since: Option<Instant> = None;
    let mut waits = pauses();
    loop {
        let why = 'attempt: {
            // Read before subscribing: a result settled after it is news, and arrives.
            if !read_before {
                if let Err(Lost(why)) = note_earlier(client, session_id, &mut follower).await? {
                    break 'attempt why;
                }
                read_before = true;
            }
            let mut stream = match client
                .subscribe(session_id, follower.last_id.as_deref())
                .await?
            {
                Ok(stream) => stream,
                Err(Lost(why)) => break 'attempt why,
            };
            if started {
                match catch_up(client, session_id, &mut follower).await? {
                    Ok(true) => {}
                    Ok(false) => return Ok(ExitCode::SUCCESS),
                    Err(Lost(why)) => break 'attempt why,
                }
            }
            match lost_since.take() {
                Some(since) if started => eprintln!(
                    "watching session {session_id} again (the stream was lost for {:.0} s)",
                    since.elapsed().as_secs_f64()
                ),
                _ => eprintln!("watching session {session_id}; Ctrl-C stops"),
            }
            started = true;
            waits = pauses();
            loop {
                match stream.next().await {
                    Ok(event) if !follower.show(&event) => return Ok(ExitCode::SUCCESS),
                    Ok(_) => {}
                    Err(Lost(why)) => break 'attempt why,
                }
            }
        };
        let since = *lost_since.get_or_insert_with(|| {
            follower.end_text_line();
            let what = if started {
                "the stream of session"
            } else {
                "cannot subscribe to session"
            };
            eprintln!(
                "{what} {session_id} at {}: {why}; trying again for up to {} s",
                client.base(),
                patience.as_secs()
            );
            Instant::now()
        });
        let pause = waits.next().unwrap_or(LONGEST_PAUSE);
        if since.elapsed() + pause > patience {
            anyhow::bail!(
                "session {session_id} at {}: {why} (gave up after {:.0} s)",
                client.base(),
                since.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(pause).await;
    }
}
