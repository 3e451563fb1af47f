//! The top-level settings every process of a deployment shares: the namespace, the extra CA
//! bundle and the dependency timeout.

use std::path::Path;
use std::time::Duration;

use super::setting::{Alias, Default, Kind, Reader, Setting, Unit};
use crate::causes::with_causes;

/// `APTIX_NAMESPACE`.
pub static NAMESPACE: Setting = Setting {
    var: "APTIX_NAMESPACE",
    key: "namespace",
    aliases: &[],
    kind: Kind::Text,
    default: Default::Value("aptix"),
    about: "prefix of every queue, exchange and Redis key (an id: letters, digits, `-`, `_`, `.`)",
};

/// `APTIX_TLS_CA_FILE`.
pub static TLS_CA_FILE: Setting = Setting {
    var: "APTIX_TLS_CA_FILE",
    key: "tls_ca_file",
    aliases: &[],
    kind: Kind::Path,
    default: Default::Unset,
    about: "a PEM bundle trusted besides the system's roots for `amqps://`, `rediss://`, an \
            `https://` model endpoint and the span exporter",
};

/// `APTIX_DEPENDENCY_TIMEOUT`.
pub static DEPENDENCY_TIMEOUT: Setting = Setting {
    var: "APTIX_DEPENDENCY_TIMEOUT",
    key: "dependency_timeout",
    aliases: &[Alias {
        var: "APTIX_DEPENDENCY_TIMEOUT_MS",
        unit: Some(Unit::Millis),
    }],
    kind: Kind::Duration,
    default: Default::Value("3s"),
    about: "the longest one Redis command, Redis connection attempt or RabbitMQ operation \
            (connect, declare, publish and its confirm) may take; past it the request gets `503`",
};

/// The settings of this part.
pub static SETTINGS: &[&Setting] = &[&NAMESPACE, &TLS_CA_FILE, &DEPENDENCY_TIMEOUT];

/// The top-level settings.
#[derive(Debug, Clone)]
pub struct Deployment {
    /// Prefix of every queue, exchange and Redis key.
    pub namespace: String,
    /// Extra trusted roots for every TLS connection.
    pub tls_ca: Option<crate::tls::ExtraCa>,
    /// The longest one Redis command or RabbitMQ operation may take.
    pub dependency_timeout: Duration,
}

impl Deployment {
    /// Reads the section.
    pub fn read(r: &Reader) -> Result<Self, super::ConfigError> {
        let namespace = r
            .parse(&NAMESPACE, |t, _| {
                crate::contract::ids::check_id(t)
                    .map(|()| t.to_string())
                    .map_err(|e| e.to_string())
            })?
            .unwrap_or_default();
        Ok(Self {
            namespace,
            tls_ca: read_ca(r)?,
            dependency_timeout: r.positive_duration(&DEPENDENCY_TIMEOUT)?,
        })
    }
}

/// The extra CA bundle, read and checked (also for the span exporter, before the runtime).
pub fn read_ca(r: &Reader) -> Result<Option<crate::tls::ExtraCa>, super::ConfigError> {
    r.parse(&TLS_CA_FILE, |path, _| {
        crate::tls::ExtraCa::load(Path::new(path)).map_err(|e| with_causes(&e))
    })
}
