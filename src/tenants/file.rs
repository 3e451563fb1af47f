//! The tenants file (`APTIX_TENANTS_FILE`): which tenants have limits, and what they are.
//!
//! ```json
//! { "tenants": [ { "id": "acme", "maxRunningTurns": 8, "tokensPerDay": 2000000,
//!     "webhookSecretEnv": "ACME_WEBHOOK_SECRET",
//!     "webhooks": [ { "url": "https://hooks.acme.example/aptix",
//!                     "events": ["turn.completed", "turn.failed"] } ] } ] }
//! ```
//!
//! Every field but `id` is optional; a tenant that is not in the file has no limits.
//! `"keepBodies": false` keeps the tenant's prompts and answers out of its turn records (the
//! requests sent, each model call's text, server tool arguments; the result, and tool outputs
//! a re-run must not repeat, are kept). Ids
//! become part of queue names and metric labels, so they are short and plain.
//! `webhookSecretEnv` names the variable with the tenant's `whsec_…` signing secret (default
//! `APTIX_WEBHOOK_SECRET`); each of `webhooks` gets the events it lists (all when it lists
//! none), signed with its own `secretEnv` or the tenant's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::webhooks::{DEFAULT_SECRET_ENV, EventType, Target, TenantWebhook};

/// The limits of one tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantLimits {
    /// At most this many of the tenant's turns run at once, across every worker.
    pub max_running_turns: Option<u32>,
    /// Model tokens (input + output, from `usage`) the tenant may spend per UTC day.
    pub tokens_per_day: Option<u64>,
    /// The estimated cost (at the agent contexts' prices) the tenant may run up per UTC day,
    /// in millionths of a US dollar (`costPerDay` in dollars in the file).
    pub cost_per_day_micros: Option<u64>,
}

/// Every tenant with limits, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenants {
    by_id: BTreeMap<String, TenantLimits>,
    /// Tenants' webhook settings: the variable with their signing secret, their webhooks.
    hooks: BTreeMap<String, (Option<String>, Vec<TenantWebhook>)>,
    /// Tenants whose turn records keep no prompt and answer bodies (`"keepBodies": false`).
    without_bodies: std::collections::BTreeSet<String>,
}

/// A tenants file that cannot be used; the message names the file or the entry.
#[derive(Debug, thiserror::Error)]
pub enum TenantsError {
    /// The file cannot be read.
    #[error("cannot read the tenants file {}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not the expected JSON (unknown fields included).
    #[error("the tenants file is not valid: {0}")]
    Malformed(String),
    /// One entry breaks a rule.
    #[error("tenants[{index}] ({id:?}): {problem}")]
    Entry {
        /// Its position in the file.
        index: usize,
        /// Its id as written.
        id: String,
        /// What is wrong.
        problem: String,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileShape {
    tenants: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Entry {
    id: String,
    max_running_turns: Option<u32>,
    tokens_per_day: Option<u64>,
    cost_per_day: Option<f64>,
    keep_bodies: Option<bool>,
    webhook_secret_env: Option<String>,
    #[serde(default)]
    webhooks: Vec<WebhookEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WebhookEntry {
    url: String,
    secret_env: Option<String>,
    #[serde(default)]
    events: Vec<String>,
}

/// Whether `name` can be an environment variable's name.
fn is_var_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// The longest tenant id (it is part of a queue name).
const MAX_ID_LEN: usize = 64;

impl Tenants {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Self, TenantsError> {
        let text = std::fs::read_to_string(path).map_err(|source| TenantsError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Checks the text of a tenants file.
    pub fn parse(text: &str) -> Result<Self, TenantsError> {
        let shape: FileShape =
            serde_json::from_str(text).map_err(|e| TenantsError::Malformed(e.to_string()))?;
        let mut by_id = BTreeMap::new();
        let mut hooks = BTreeMap::new();
        let mut without_bodies = std::collections::BTreeSet::new();
        for (index, entry) in shape.tenants.into_iter().enumerate() {
            let problem = |problem: &str| TenantsError::Entry {
                index,
                id: entry.id.clone(),
                problem: problem.to_string(),
            };
            let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
            if entry.id.is_empty() || entry.id.len() > MAX_ID_LEN || !entry.id.chars().all(plain) {
                return Err(problem(
                    "an id is 1 to 64 characters of letters, digits, '-', '_' and '.'",
                ));
            }
            if entry.max_running_turns == Some(0) {
                return Err(problem(
                    "maxRunningTurns must be at least 1 (leave it out for no limit)",
                ));
            }
            if entry.tokens_per_day == Some(0) {
                return Err(problem(
                    "tokensPerDay must be at least 1 (leave it out for no limit)",
                ));
            }
            let cost_per_day_micros = match entry.cost_per_day {
                None => None,
                Some(usd) if usd > 0.0 && (0.0..1e9).contains(&usd) => {
                    Some((usd * 1e6).round() as u64)
                }
                Some(_) => {
                    return Err(problem(
                        "costPerDay is dollars above 0 (leave it out for no limit)",
                    ));
                }
            };
            if let Some(var) = &entry.webhook_secret_env
                && !is_var_name(var)
            {
                return Err(problem(
                    "webhookSecretEnv names an environment variable (A-Z, 0-9 and _)",
                ));
            }
            let mut webhooks = Vec::new();
            for (i, w) in entry.webhooks.iter().enumerate() {
                let bad = |what: String| problem(&format!("webhooks[{i}]: {what}"));
                match reqwest::Url::parse(&w.url) {
                    Ok(u) if matches!(u.scheme(), "https" | "http") && u.host_str().is_some() => {}
                    _ => return Err(bad(format!("{:?} is not an http(s) URL", w.url))),
                }
                if let Some(var) = &w.secret_env
                    && !is_var_name(var)
                {
                    return Err(bad(
                        "secretEnv names an environment variable (A-Z, 0-9 and _)".into(),
                    ));
                }
                let mut events = Vec::new();
                for name in &w.events {
                    let Some(event) = EventType::parse(name) else {
                        let known: Vec<&str> = EventType::ALL.iter().map(|e| e.as_str()).collect();
                        return Err(bad(format!(
                            "{name:?} is not an event ({})",
                            known.join(", ")
                        )));
                    };
                    events.push(event);
                }
                let secret_env = w
                    .secret_env
                    .clone()
                    .or_else(|| entry.webhook_secret_env.clone())
                    .unwrap_or_else(|| DEFAULT_SECRET_ENV.to_string());
                webhooks.push(TenantWebhook {
                    target: Target {
                        url: w.url.clone(),
                        secret_env,
                    },
                    events,
                });
            }
            let limits = TenantLimits {
                max_running_turns: entry.max_running_turns,
                tokens_per_day: entry.tokens_per_day,
                cost_per_day_micros,
            };
            if by_id.insert(entry.id.clone(), limits).is_some() {
                return Err(problem("the id is defined twice"));
            }
            if entry.keep_bodies == Some(false) {
                without_bodies.insert(entry.id.clone());
            }
            if entry.webhook_secret_env.is_some() || !webhooks.is_empty() {
                hooks.insert(entry.id.clone(), (entry.webhook_secret_env, webhooks));
            }
        }
        Ok(Self {
            by_id,
            hooks,
            without_bodies,
        })
    }

    /// Tenants from `(id, limits)` pairs (tests, and deployments built in code).
    pub fn from_limits<'a>(pairs: impl IntoIterator<Item = (&'a str, TenantLimits)>) -> Self {
        Self {
            by_id: pairs
                .into_iter()
                .map(|(id, l)| (id.to_string(), l))
                .collect(),
            hooks: BTreeMap::new(),
            without_bodies: Default::default(),
        }
    }

    /// Whether `tenant`'s turn records keep what the model was sent and answered and the
    /// server tools' arguments (for the turn inspector): yes unless its entry says
    /// `"keepBodies": false`.
    pub fn keeps_bodies(&self, tenant: &str) -> bool {
        !self.without_bodies.contains(tenant)
    }

    /// The variable holding `tenant`'s webhook signing secret.
    pub fn signing_env(&self, tenant: &str) -> &str {
        self.hooks
            .get(tenant)
            .and_then(|(env, _)| env.as_deref())
            .unwrap_or(DEFAULT_SECRET_ENV)
    }

    /// `tenant`'s webhooks from the file.
    pub fn webhooks(&self, tenant: &str) -> &[TenantWebhook] {
        self.hooks.get(tenant).map_or(&[], |(_, w)| w.as_slice())
    }

    /// Where `batch.completed` of `batch` goes: the batch's own webhook and its tenant's
    /// webhooks that want it.
    pub fn batch_targets(&self, batch: &crate::state::BatchRecord) -> Vec<Target> {
        self.webhook_targets(
            Some(&batch.tenant),
            batch.webhook.as_deref(),
            EventType::BatchCompleted,
        )
    }

    /// Where `event` of a turn of `tenant` goes: the submission's own `url` (signed with the
    /// tenant's secret) and the tenant's webhooks that want it. Empty for most turns, at the
    /// cost of a map lookup.
    pub fn webhook_targets(
        &self,
        tenant: Option<&str>,
        url: Option<&str>,
        event: EventType,
    ) -> Vec<Target> {
        let tenant = tenant.unwrap_or_default();
        let mut targets = Vec::new();
        if let Some(url) = url {
            targets.push(Target {
                url: url.to_string(),
                secret_env: self.signing_env(tenant).to_string(),
            });
        }
        targets.extend(
            self.webhooks(tenant)
                .iter()
                .filter(|w| w.wants(event))
                .map(|w| w.target.clone()),
        );
        targets
    }

    /// Every variable the file names for a signing secret.
    pub fn secret_envs(&self) -> impl Iterator<Item = &str> {
        self.hooks.values().flat_map(|(env, hooks)| {
            env.as_deref()
                .into_iter()
                .chain(hooks.iter().map(|h| h.target.secret_env.as_str()))
        })
    }

    /// Every tenant's webhooks, by tenant (for start-up checks).
    pub fn all_webhooks(&self) -> impl Iterator<Item = (&str, &TenantWebhook)> {
        self.hooks
            .iter()
            .flat_map(|(id, (_, hooks))| hooks.iter().map(move |h| (id.as_str(), h)))
    }

    /// The limits of `tenant` (none when it is not in the file).
    pub fn limits(&self, tenant: &str) -> TenantLimits {
        self.by_id.get(tenant).copied().unwrap_or_default()
    }

    /// Whether `tenant` is in the file.
    pub fn is_configured(&self, tenant: &str) -> bool {
        self.by_id.contains_key(tenant)
    }

    /// Every configured tenant with its limits, by id.
    pub fn iter(&self) -> impl Iterator<Item = (&str, TenantLimits)> {
        self.by_id.iter().map(|(id, l)| (id.as_str(), *l))
    }

    /// The tenants whose running turns are capped, with their caps.
    pub fn capped(&self) -> impl Iterator<Item = (&str, u32)> {
        self.iter()
            .filter_map(|(id, l)| l.max_running_turns.map(|n| (id, n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_of_the_documented_shape_is_read() {
        let t = Tenants::parse(
            r#"{"tenants":[{"id":"acme","maxRunningTurns":8,"tokensPerDay":2000,"costPerDay":12.5},{"id":"b.c-d_e"}]}"#,
        )
        .unwrap();
        assert_eq!(
            t.limits("acme"),
            TenantLimits {
                max_running_turns: Some(8),
                tokens_per_day: Some(2000),
                cost_per_day_micros: Some(12_500_000),
            }
        );
        assert_eq!(t.limits("b.c-d_e"), TenantLimits::default());
        assert!(t.is_configured("b.c-d_e"));
        assert_eq!(t.limits("nobody"), TenantLimits::default());
        assert!(!t.is_configured("nobody"));
        assert_eq!(t.capped().collect::<Vec<_>>(), vec![("acme", 8)]);
    }

    #[test]
    fn the_example_file_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tenants.json");
        let t = Tenants::load(&path).unwrap();
        assert_eq!(t.capped().count(), 2);
        assert_eq!(t.limits("trial").tokens_per_day, Some(50_000));
    }

    #[test]
    fn webhooks_name_their_events_and_secrets() {
        let t = Tenants::parse(
            r#"{"tenants":[{"id":"acme","webhookSecretEnv":"ACME_SECRET","webhooks":[
                {"url":"https://a.example/h","events":["turn.completed","batch.completed"]},
                {"url":"https://b.example/h","secretEnv":"B_SECRET"}]},{"id":"plain"}]}"#,
        )
        .unwrap();
        assert_eq!(t.signing_env("acme"), "ACME_SECRET");
        assert_eq!(t.signing_env("plain"), DEFAULT_SECRET_ENV);
        assert_eq!(t.signing_env("nobody"), DEFAULT_SECRET_ENV);
        let hooks = t.webhooks("acme");
        assert_eq!(hooks.len(), 2);
        assert_eq!(hooks[0].target.secret_env, "ACME_SECRET");
        assert!(hooks[0].wants(EventType::BatchCompleted));
        assert!(!hooks[0].wants(EventType::TurnFailed));
        assert_eq!(hooks[1].target.secret_env, "B_SECRET");
        assert!(
            hooks[1].wants(EventType::TurnFailed),
            "no list: every event"
        );
        assert!(t.webhooks("plain").is_empty());
        assert_eq!(t.all_webhooks().count(), 2);
    }

    #[test]
    fn every_broken_rule_names_its_entry() {
        let cases = [
            (
                r#"{"tenants":[{"id":"a b"}]}"#,
                r#"tenants[0] ("a b"): an id is"#,
            ),
            (
                r#"{"tenants":[{"id":"a"},{"id":"a"}]}"#,
                r#"tenants[1] ("a"): the id is defined twice"#,
            ),
            (
                r#"{"tenants":[{"id":"a","maxRunningTurns":0}]}"#,
                "maxRunningTurns must be at least 1",
            ),
            (
                r#"{"tenants":[{"id":"a","tokensPerDay":0}]}"#,
                "tokensPerDay must be at least 1",
            ),
            (
                r#"{"tenants":[{"id":"a","maxRunning":3}]}"#,
                "unknown field `maxRunning`",
            ),
            (r#"{"tenants":[{"id":""}]}"#, "an id is 1 to 64"),
            (
                r#"{"tenants":[{"id":"a","webhooks":[{"url":"ftp://x/"}]}]}"#,
                r#"tenants[0] ("a"): webhooks[0]: "ftp://x/" is not an http(s) URL"#,
            ),
            (
                r#"{"tenants":[{"id":"a","webhooks":[{"url":"https://x/","events":["turn.done"]}]}]}"#,
                r#"webhooks[0]: "turn.done" is not an event (turn.completed"#,
            ),
            (
                r#"{"tenants":[{"id":"a","webhookSecretEnv":"lower case"}]}"#,
                "webhookSecretEnv names an environment variable",
            ),
            (
                &format!(r#"{{"tenants":[{{"id":"{}"}}]}}"#, "x".repeat(65)),
                "an id is 1 to 64",
            ),
        ];
        for (text, expected) in cases {
            let e = Tenants::parse(text).unwrap_err().to_string();
            assert!(e.contains(expected), "{text}: {e}");
        }
    }
}
