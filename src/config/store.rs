//! `[store]`: Redis, its replicas, how long records live and the session lease.

use std::time::Duration;

use super::setting::{Alias, Default, Kind, Reader, Setting, Unit};
use super::{ConfigError, Secret};

/// `APTIX_REDIS_URL`.
pub static URL: Setting = Setting {
    var: "APTIX_REDIS_URL",
    key: "store.url",
    aliases: &[],
    kind: Kind::SecretUrls,
    default: Default::Unset,
    about: "Redis URL; unset = the embedded in-memory store. With `APTIX_REDIS_CLUSTER`, nodes of \
            a Redis Cluster comma-separated (one reachable node is enough)",
};

/// `APTIX_REDIS_CLUSTER`.
pub static CLUSTER: Setting = Setting {
    var: "APTIX_REDIS_CLUSTER",
    key: "store.cluster",
    aliases: &[],
    kind: Kind::Flag,
    default: Default::Value("false"),
    about: "the store, the limiter and the retrieval index run on a Redis Cluster: every script \
            and pipeline touches one slot (a session's keys share the hash tag `{sessionId}`)",
};

/// `APTIX_REDIS_MIN_REPLICAS`.
pub static MIN_REPLICAS: Setting = Setting {
    var: "APTIX_REDIS_MIN_REPLICAS",
    key: "store.min_replicas",
    aliases: &[],
    kind: Kind::Number,
    default: Default::Value("0"),
    about: "replicas that must hold a settled turn and each new fencing token (`WAIT`) before its \
            status is published and its job acknowledged; `0` = the primary's word is enough",
};

/// `APTIX_REDIS_REPLICA_TIMEOUT`.
pub static REPLICA_TIMEOUT: Setting = Setting {
    var: "APTIX_REDIS_REPLICA_TIMEOUT",
    key: "store.replica_timeout",
    aliases: &[Alias {
        var: "APTIX_REDIS_REPLICA_TIMEOUT_MS",
        unit: Some(Unit::Millis),
    }],
    kind: Kind::Duration,
    default: Default::Value("1s"),
    about: "how long one such wait may take (keep it below the dependency timeout)",
};

/// `APTIX_RESULT_TTL`.
pub static RESULT_TTL: Setting = Setting {
    var: "APTIX_RESULT_TTL",
    key: "store.result_ttl",
    aliases: &[Alias {
        var: "APTIX_RESULT_TTL_SECS",
        unit: Some(Unit::Seconds),
    }],
    kind: Kind::Duration,
    default: Default::Value("7d"),
    about: "how long turn records, results and tool ledgers are kept after their last write",
};

/// `APTIX_SESSION_TTL`.
pub static SESSION_TTL: Setting = Setting {
    var: "APTIX_SESSION_TTL",
    key: "store.session_ttl",
    aliases: &[Alias {
        var: "APTIX_SESSION_TTL_SECS",
        unit: Some(Unit::Seconds),
    }],
    kind: Kind::Duration,
    default: Default::Value("30d"),
    about: "how long an idle session (mode, history, continuation state) is kept; its turns list and latched contexts last the longer of this and APTIX_RESULT_TTL",
};

/// `APTIX_LEASE`.
pub static LEASE: Setting = Setting {
    var: "APTIX_LEASE",
    key: "store.lease",
    aliases: &[Alias {
        var: "APTIX_LEASE_SECS",
        unit: Some(Unit::Seconds),
    }],
    kind: Kind::Duration,
    default: Default::Value("30s"),
    about: "how long a session lease lasts without renewal",
};

/// The settings of this section.
pub static SETTINGS: &[&Setting] = &[
    &URL,
    &CLUSTER,
    &MIN_REPLICAS,
    &REPLICA_TIMEOUT,
    &RESULT_TTL,
    &SESSION_TTL,
    &LEASE,
];

/// `[store]`.
#[derive(Debug, Clone)]
pub struct Store {
    /// Redis; `None` = the embedded in-memory store.
    pub url: Option<Secret>,
    /// The URL names nodes of a Redis Cluster.
    pub cluster: bool,
    /// Replicas that must hold a settled turn before it counts; 0: off.
    pub min_replicas: u32,
    /// How long to wait for them.
    pub replica_timeout: Duration,
    /// How long turn records and idle sessions are kept.
    pub retention: crate::store::Retention,
    /// How long a session lease lasts without renewal.
    pub lease: Duration,
}

impl Store {
    /// Reads the section.
    pub fn read(r: &Reader) -> Result<Self, ConfigError> {
        Ok(Self {
            url: r.text(&URL)?.map(Secret::new),
            cluster: r.flag(&CLUSTER)?,
            min_replicas: r
                .parse(&MIN_REPLICAS, |t, _| {
                    t.parse()
                        .map_err(|_| format!("{t:?} is not a number of replicas (0 turns it off)"))
                })?
                .unwrap_or(0),
            replica_timeout: r.positive_duration(&REPLICA_TIMEOUT)?,
            retention: crate::store::Retention {
                turns: r.positive_duration(&RESULT_TTL)?,
                sessions: r.positive_duration(&SESSION_TTL)?,
            },
            lease: r.positive_duration(&LEASE)?,
        })
    }
}
