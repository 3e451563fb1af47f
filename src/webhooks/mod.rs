//! Webhooks: a turn's settled status (and a batch's end) pushed to the caller's endpoint,
//! signed as the Standard Webhooks specification says, delivered at least once.
//!
//! Where a delivery comes from: a submission's own `webhook` URL (kept with the turn, signed
//! with its tenant's secret) and the tenant's webhooks in the tenants file (each with the
//! events it wants). When a turn's status is delivered ([`crate::delivery`]), one [`HookJob`]
//! per target goes on the durable webhook queue ([`crate::queue::HookQueue`]); the sender
//! ([`send`]) POSTs it, retries it on a schedule through delayed queues, and dead-letters what
//! never succeeds. A job never holds a secret: it names the variable the secret is in.
//!
//! Owns: events, targets, the job format, signing ([`sign`]), the URL policy ([`guard`]) and
//! sending ([`send`]). Must not: decide when a turn settles.

pub mod dead;
pub mod guard;
pub mod send;
pub mod sign;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::state::{TurnStatus, TurnStatusView};

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventType {
    /// A turn completed.
    #[serde(rename = "turn.completed")]
    TurnCompleted,
    /// A turn failed.
    #[serde(rename = "turn.failed")]
    TurnFailed,
    /// A turn waits for the client's tool results.
    #[serde(rename = "turn.awaiting_client_tools")]
    TurnAwaitingClientTools,
    /// A turn was cancelled.
    #[serde(rename = "turn.cancelled")]
    TurnCancelled,
    /// Every line of a batch settled.
    #[serde(rename = "batch.completed")]
    BatchCompleted,
}

impl EventType {
    /// Every event type.
    pub const ALL: [Self; 5] = [
        Self::TurnCompleted,
        Self::TurnFailed,
        Self::TurnAwaitingClientTools,
        Self::TurnCancelled,
        Self::BatchCompleted,
    ];

    /// The wire name (`turn.completed`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TurnCompleted => "turn.completed",
            Self::TurnFailed => "turn.failed",
            Self::TurnAwaitingClientTools => "turn.awaiting_client_tools",
            Self::TurnCancelled => "turn.cancelled",
            Self::BatchCompleted => "batch.completed",
        }
    }

    /// Reads a wire name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == name)
    }

    /// The event of a settled status (`None` for queued and running).
    pub fn of(status: TurnStatus) -> Option<Self> {
        match status {
            TurnStatus::Completed => Some(Self::TurnCompleted),
            TurnStatus::Failed => Some(Self::TurnFailed),
            TurnStatus::AwaitingClientTools => Some(Self::TurnAwaitingClientTools),
            TurnStatus::Cancelled => Some(Self::TurnCancelled),
            TurnStatus::Queued | TurnStatus::Running => None,
        }
    }
}

/// One endpoint an event goes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// Where it is POSTed.
    pub url: String,
    /// The variable holding the `whsec_…` secret that signs it.
    pub secret_env: String,
}

/// A tenant's webhook from the tenants file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantWebhook {
    /// The endpoint and its secret.
    pub target: Target,
    /// The events it wants (every event when empty).
    pub events: Vec<EventType>,
}

impl TenantWebhook {
    /// Whether `event` goes to this webhook.
    pub fn wants(&self, event: EventType) -> bool {
        self.events.is_empty() || self.events.contains(&event)
    }
}

/// The variable holding the deployment's signing secret: the secret of tenants that name
/// none of their own — the local tenant's as it is, every other tenant's derived from it
/// ([`signing_key`]).
pub const DEFAULT_SECRET_ENV: &str = "APTIX_WEBHOOK_SECRET";

/// The key that signs `tenant`'s deliveries to `target`, when the process has its secret: the
/// target's secret as it is, except the deployment's ([`DEFAULT_SECRET_ENV`]) for a named
/// tenant, which signs with the tenant's own secret derived from it
/// ([`sign::SigningKey::for_tenant`]) — so no tenant can sign, or replay, what verifies at
/// another tenant's receiver.
pub fn signing_key(
    secrets: &sign::Secrets,
    target: &Target,
    tenant: &str,
) -> Option<sign::SigningKey> {
    let key = secrets.get(&target.secret_env)?;
    let named = !tenant.is_empty() && tenant != crate::contract::LOCAL_TENANT;
    Some(if named && target.secret_env == DEFAULT_SECRET_ENV {
        key.for_tenant(tenant)
    } else {
        key.clone()
    })
}

/// One delivery: everything the sender needs, as it travels on the webhook queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookJob {
    /// The event's id, the same for every delivery of it (`webhook-id`): receivers
    /// de-duplicate by it.
    pub id: String,
    /// The event type.
    pub event: EventType,
    /// Where it goes, and with which secret.
    pub target: Target,
    /// The tenant the event belongs to.
    pub tenant: String,
    /// The exact body to POST (JSON text): the same bytes on every attempt.
    pub body: String,
    /// The W3C trace context of the turn, sent as `traceparent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Attempts made so far.
    #[serde(default)]
    pub attempts: u32,
    /// When the event was first enqueued (seconds since the Unix epoch).
    pub first_at: i64,
    /// What the last failed attempt got, for `aptix webhooks failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The batch line whose turn event this is, when the batch's completion is told of: the
    /// sender notes the delivery finished (delivered or dead-lettered), and `batch.completed`
    /// waits for every line's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<LineOf>,
}

/// A line of a batch: the batch and the line's turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LineOf {
    /// The batch.
    pub batch: String,
    /// The turn's session (scoped to its tenant).
    #[serde(with = "crate::contract::ids::scoped")]
    pub session_id: crate::contract::SessionId,
    /// The turn.
    pub turn_id: crate::contract::TurnId,
}

/// A stable event id for a turn's settled status: the same (session, turn, status, attempt)
/// always gives the same id, so a status delivered twice (a job run again after a crash) is
/// one event to the receiver.
pub fn turn_event_id(view: &TurnStatusView) -> String {
    event_id(&[
        view.session_id.as_str(),
        view.turn_id.as_str(),
        view.status.as_str(),
        &view.attempts.to_string(),
    ])
}

/// `evt_` and the first 32 hex digits of the SHA-256 of `parts`, each ended by a NUL.
fn event_id(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for part in parts {
        h.update(part.as_bytes());
        h.update([0]);
    }
    format!("evt_{}", &crate::hex::lower(&h.finalize())[..32])
}

/// The body of an event: `{"type", "timestamp", "tenant", "data"}` (the tenant is signed with
/// the rest: a receiver serving several tenants knows whose event it holds).
pub fn event_body(
    event: EventType,
    timestamp: &str,
    tenant: &str,
    data: &impl Serialize,
) -> String {
    let tenant = if tenant.is_empty() {
        crate::contract::LOCAL_TENANT
    } else {
        tenant
    };
    serde_json::json!({"type": event.as_str(), "timestamp": timestamp, "tenant": tenant, "data": data})
        .to_string()
}

/// The jobs of a turn's settled status `view` for `targets`: one per target, with the same
/// id and body; none for a status that is no event.
pub fn turn_jobs(
    view: &TurnStatusView,
    tenant: &str,
    targets: &[Target],
    traceparent: Option<&str>,
) -> Vec<HookJob> {
    let Some(event) = EventType::of(view.status) else {
        return Vec::new();
    };
    if targets.is_empty() {
        return Vec::new();
    }
    let timestamp = view
        .completed_at
        .clone()
        .unwrap_or_else(crate::state::now_rfc3339);
    let body = event_body(event, &timestamp, tenant, view);
    jobs(
        (event, turn_event_id(view), body),
        tenant,
        targets,
        traceparent,
    )
}

/// The jobs of `batch.completed` for `progress` (every line settled), one per target; the
/// event id is the batch's, so telling of it twice is one event to the receiver.
pub fn batch_jobs(
    progress: &crate::state::BatchProgress,
    tenant: &str,
    targets: &[Target],
) -> Vec<HookJob> {
    let event = EventType::BatchCompleted;
    let id = event_id(&[&progress.batch_id, event.as_str()]);
    let body = event_body(event, &crate::state::now_rfc3339(), tenant, progress);
    jobs((event, id, body), tenant, targets, None)
}

/// One job per target of the same event (id and body), first enqueued now.
fn jobs(
    (event, id, body): (EventType, String, String),
    tenant: &str,
    targets: &[Target],
    traceparent: Option<&str>,
) -> Vec<HookJob> {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    targets
        .iter()
        .map(|target| HookJob {
            id: id.clone(),
            event,
            target: target.clone(),
            tenant: tenant.to_string(),
            body: body.clone(),
            traceparent: traceparent.map(str::to_string),
            attempts: 0,
            first_at: now,
            last_error: None,
            line: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{SessionId, TurnId};

    fn view(status: TurnStatus, attempts: u32) -> TurnStatusView {
        TurnStatusView {
            session_id: SessionId::parse("s").unwrap(),
            turn_id: TurnId::parse("t").unwrap(),
            status,
            attempts,
            submitted_at: "2026-11-26T00:00:00Z".into(),
            completed_at: Some("2026-11-26T00:00:01Z".into()),
            result: None,
            service_tier: None,
        }
    }

    #[test]
    fn an_events_id_is_stable_per_turn_status_and_run() {
        let a = turn_event_id(&view(TurnStatus::Completed, 1));
        assert_eq!(a, turn_event_id(&view(TurnStatus::Completed, 1)));
        assert_ne!(a, turn_event_id(&view(TurnStatus::Failed, 1)));
        assert_ne!(a, turn_event_id(&view(TurnStatus::Completed, 2)));
        assert!(a.starts_with("evt_") && a.len() == 36, "{a}");
    }

    #[test]
    fn a_settled_status_makes_one_job_per_target_with_the_documented_body() {
        let targets = [
            Target {
                url: "https://a.example/".into(),
                secret_env: "A".into(),
            },
            Target {
                url: "https://b.example/".into(),
                secret_env: "B".into(),
            },
        ];
        let jobs = turn_jobs(
            &view(TurnStatus::AwaitingClientTools, 1),
            "acme",
            &targets,
            None,
        );
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].id, jobs[1].id);
        assert_eq!(jobs[0].body, jobs[1].body);
        let body: serde_json::Value = serde_json::from_str(&jobs[0].body).unwrap();
        assert_eq!(body["type"], "turn.awaiting_client_tools");
        assert_eq!(body["timestamp"], "2026-11-26T00:00:01Z");
        assert_eq!(body["data"]["turnId"], "t");
        assert!(turn_jobs(&view(TurnStatus::Running, 1), "acme", &targets, None).is_empty());
        for e in EventType::ALL {
            assert_eq!(EventType::parse(e.as_str()), Some(e));
            assert_eq!(
                serde_json::to_value(e).unwrap(),
                serde_json::json!(e.as_str())
            );
        }
    }
}
