//! `[http]`: the front door's callers, its connections and the console.

use std::time::Duration;

use super::ConfigError;
use super::setting::{Alias, Default, Kind, Reader, Setting, Unit};
use crate::tokens::ApiTokens;

/// `APTIX_API_TOKENS`.
pub static API_TOKENS: Setting = Setting {
    var: "APTIX_API_TOKENS",
    key: "http.api_tokens",
    aliases: &[],
    kind: Kind::Secret,
    default: Default::Unset,
    about: "`token=tenant,token=tenant`: who may call the front door; `token=tenant:admin` makes an \
            admin token (every tenant's work, the system pages); unset = no authentication",
};

/// `APTIX_HTTP_READ_TIMEOUT`.
pub static READ_TIMEOUT: Setting = Setting {
    var: "APTIX_HTTP_READ_TIMEOUT",
    key: "http.read_timeout",
    aliases: &[Alias {
        var: "APTIX_HTTP_READ_TIMEOUT_SECS",
        unit: Some(Unit::Seconds),
    }],
    kind: Kind::Duration,
    default: Default::Value("15s"),
    about: "how long the API waits for a client's next bytes (headers, the rest of a body, the \
            next request on a keep-alive connection, a stream on an HTTP/2 connection) before \
            closing the connection",
};

/// `APTIX_CONSOLE`.
pub static CONSOLE: Setting = Setting {
    var: "APTIX_CONSOLE",
    key: "http.console",
    aliases: &[],
    kind: Kind::Flag,
    default: Default::Computed(
        "`false`; `true` in `aptix run` and the embedded server of `aptix batch`",
    ),
    about: "serve the operators' console at `/console`",
};

/// The settings of this section.
pub static SETTINGS: &[&Setting] = &[&API_TOKENS, &READ_TIMEOUT, &CONSOLE];

/// `[http]`.
#[derive(Debug, Clone)]
pub struct Http {
    /// Bearer token → tenant.
    pub api_tokens: ApiTokens,
    /// How long the API waits for a client's next bytes.
    pub read_timeout: Duration,
    /// Serve the console (`None`: not set; off unless the command turns it on).
    pub console: Option<bool>,
}

impl Http {
    /// Reads the section.
    pub fn read(r: &Reader) -> Result<Self, ConfigError> {
        Ok(Self {
            api_tokens: r
                .parse(&API_TOKENS, |t, _| ApiTokens::parse(t))?
                .unwrap_or_default(),
            read_timeout: r.positive_duration(&READ_TIMEOUT)?,
            console: r.parse(&CONSOLE, |t, _| super::setting::parse_flag(t))?,
        })
    }

    /// Whether the console is served (off unless set).
    pub fn console_on(&self) -> bool {
        self.console.unwrap_or(false)
    }
}
