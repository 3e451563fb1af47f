//! `[telemetry]`: how the process logs. Span export follows OpenTelemetry's own variables
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`), read by its SDK.

use super::ConfigError;
use super::setting::{Default, Kind, Reader, Setting};
use crate::telemetry::LogFormat;

/// `APTIX_LOG_FORMAT`.
pub static LOG_FORMAT: Setting = Setting {
    var: "APTIX_LOG_FORMAT",
    key: "telemetry.log_format",
    aliases: &[],
    kind: Kind::Choice(&["text", "json"]),
    default: Default::Value("text"),
    about: "`text`, or `json`: one JSON object per line (see docs/operations.md)",
};

/// The settings of this section.
pub static SETTINGS: &[&Setting] = &[&LOG_FORMAT];

/// `[telemetry]`.
#[derive(Debug, Clone)]
pub struct Telemetry {
    /// How log lines are written.
    pub log_format: LogFormat,
}

impl Telemetry {
    /// Reads the section (the binary reads it before the runtime starts).
    pub fn read(r: &Reader) -> Result<Self, ConfigError> {
        Ok(Self {
            log_format: r
                .parse(&LOG_FORMAT, |t, _| {
                    LogFormat::parse(Some(t)).map_err(|e| e.to_string())
                })?
                .unwrap_or(LogFormat::Text),
        })
    }
}
