//! `[webhooks]`: where webhooks may point, how they are sent and the secrets that sign them.

use std::sync::Arc;

use super::ConfigError;
use super::setting::{Alias, Default, Kind, Reader, Setting, Unit};
use crate::webhooks::guard::{Allowed, Guard};
use crate::webhooks::send::SendSettings;
use crate::webhooks::sign::{Secrets, SigningKey};

/// `APTIX_WEBHOOK_SECRET`.
pub static SECRET: Setting = Setting {
    var: crate::webhooks::DEFAULT_SECRET_ENV,
    key: "webhooks.secret",
    aliases: &[],
    kind: Kind::Secret,
    default: Default::Unset,
    about: "the `whsec_` secret that signs the `local` tenant's deliveries, and from which each \
            named tenant's own is derived (a tenant's entry may name another variable)",
};

/// `APTIX_WEBHOOK_ALLOW_HTTP`.
pub static ALLOW_HTTP: Setting = Setting {
    var: "APTIX_WEBHOOK_ALLOW_HTTP",
    key: "webhooks.allow_http",
    aliases: &[],
    kind: Kind::Flag,
    default: Default::Value("false"),
    about: "`http` webhook URLs are accepted too (tests, internal receivers)",
};

/// `APTIX_WEBHOOK_ALLOW`.
pub static ALLOW: Setting = Setting {
    var: "APTIX_WEBHOOK_ALLOW",
    key: "webhooks.allow",
    aliases: &[],
    kind: Kind::Text,
    default: Default::Unset,
    about: "host names and address ranges (comma-separated) a webhook may point at although they \
            are not public",
};

/// `APTIX_WEBHOOK_TIMEOUT`.
pub static TIMEOUT: Setting = Setting {
    var: "APTIX_WEBHOOK_TIMEOUT",
    key: "webhooks.timeout",
    aliases: &[Alias {
        var: "APTIX_WEBHOOK_TIMEOUT_SECS",
        unit: Some(Unit::Seconds),
    }],
    kind: Kind::Duration,
    default: Default::Value("10s"),
    about: "the longest one delivery's POST may take",
};

/// `APTIX_WEBHOOK_CONCURRENCY`.
pub static CONCURRENCY: Setting = Setting {
    var: "APTIX_WEBHOOK_CONCURRENCY",
    key: "webhooks.concurrency",
    aliases: &[],
    kind: Kind::Number,
    default: Default::Value("32"),
    about: "deliveries one process sends at once",
};

/// `APTIX_WEBHOOK_RETRY_DELAYS`.
pub static RETRY_DELAYS: Setting = Setting {
    var: "APTIX_WEBHOOK_RETRY_DELAYS",
    key: "webhooks.retry_delays",
    aliases: &[Alias {
        var: "APTIX_WEBHOOK_RETRY_DELAYS_SECS",
        unit: Some(Unit::Seconds),
    }],
    kind: Kind::Durations,
    default: Default::Value("5s,30s,2m,10m,1h"),
    about: "the wait before each retry of a failed delivery, in order (the last repeats); one \
            delay queue each, at most 20",
};

/// `APTIX_WEBHOOK_GIVE_UP`.
pub static GIVE_UP: Setting = Setting {
    var: "APTIX_WEBHOOK_GIVE_UP",
    key: "webhooks.give_up",
    aliases: &[Alias {
        var: "APTIX_WEBHOOK_GIVE_UP_SECS",
        unit: Some(Unit::Seconds),
    }],
    kind: Kind::Duration,
    default: Default::Value("24h"),
    about: "a delivery still failing this long after its event is dead-lettered",
};

/// The settings of this section.
pub static SETTINGS: &[&Setting] = &[
    &SECRET,
    &ALLOW_HTTP,
    &ALLOW,
    &TIMEOUT,
    &CONCURRENCY,
    &RETRY_DELAYS,
    &GIVE_UP,
];

/// `[webhooks]` (see [`crate::webhooks`]).
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// `http` URLs are accepted too.
    pub allow_http: bool,
    /// Hosts and address ranges allowed although not public.
    pub allow: Allowed,
    /// How deliveries are sent.
    pub send: SendSettings,
    /// The signing secrets that are set, by variable: `APTIX_WEBHOOK_SECRET` and every variable
    /// the tenants file names (read once, at start-up).
    pub secrets: Arc<Secrets>,
}

impl WebhookConfig {
    /// The URL policy of these settings.
    pub fn guard(&self) -> Guard {
        Guard::new(self.allow_http, self.allow.clone())
    }

    /// Reads the section; `tenants` names the variables of the tenants' own secrets.
    pub fn read(r: &Reader, tenants: &crate::tenants::Tenants) -> Result<Self, ConfigError> {
        let mut secrets = Secrets::default();
        let signing =
            |name: &str, text: &str| SigningKey::parse(text).map_err(|e| format!("{name}: {e}"));
        if let Some(key) = r.parse(&SECRET, |t, _| signing(SECRET.var, t))? {
            secrets.insert(SECRET.var.to_string(), key);
        }
        for name in tenants.secret_envs().filter(|n| *n != SECRET.var) {
            if let Some(value) = r.sources().env(name) {
                let key = signing(name, &value).map_err(|problem| ConfigError {
                    var: SECRET.var,
                    problem,
                })?;
                secrets.insert(name.to_string(), key);
            }
        }
        Ok(Self {
            allow_http: r.flag(&ALLOW_HTTP)?,
            allow: r
                .parse(&ALLOW, |t, _| t.parse::<Allowed>())?
                .unwrap_or_default(),
            send: SendSettings {
                timeout: r.positive_duration(&TIMEOUT)?,
                concurrency: r.positive(&CONCURRENCY)?,
                delays: r.durations(&RETRY_DELAYS, 20)?,
                give_up_after: r.positive_duration(&GIVE_UP)?,
            },
            secrets: Arc::new(secrets),
        })
    }
}
