//! Logs an operator can ship: `APTIX_LOG_FORMAT=text` (default) or `json`, levels from
//! `RUST_LOG`, always on stderr. JSON lines carry the timestamp, level, target, message, the
//! event's fields and the fields of the spans around it (`session_id`, `turn_id`, `attempt`,
//! `request_id`, …). Colour codes only when stderr is a terminal, never in a file or a pipe.
//!
//! Text lines on a terminal are tracing-subscriber's, in colour; elsewhere (`plain.rs`) the same
//! line is written without terminal styles, its time by `clock.rs`.
//!
//! With `OTEL_EXPORTER_OTLP_ENDPOINT` set (and the default `otel` feature), spans are also
//! exported to an OpenTelemetry collector (`otlp.rs`); the turn's spans join the caller's
//! trace through [`crate::trace`].
//!
//! Owns: installing the process's one subscriber and exporter. Must not: be called by library
//! code.

mod clock;
#[cfg(feature = "otel")]
pub mod otlp;
mod plain;

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// Telemetry that cannot be set up as configured.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `APTIX_LOG_FORMAT` is neither `text` nor `json`.
    #[error("APTIX_LOG_FORMAT must be \"text\" or \"json\", not {0:?}")]
    LogFormat(String),
    /// Span export was asked for outside the async runtime.
    #[error("span export needs the async runtime to be running")]
    NoRuntime,
    /// The exporter's HTTP client or the exporter itself cannot be built.
    #[error("span export: {0}")]
    Exporter(String),
}

/// OpenTelemetry's variables that ask for span export (either is enough).
pub const EXPORT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
];

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// Reads `APTIX_LOG_FORMAT` (absent = text); anything else than `text` or `json` is an
    /// error naming the variable.
    pub fn parse(value: Option<&str>) -> Result<Self, TelemetryError> {
        match value.map(str::trim) {
            None | Some("") | Some("text") => Ok(Self::Text),
            Some("json") => Ok(Self::Json),
            Some(other) => Err(TelemetryError::LogFormat(other.to_string())),
        }
    }
}

/// The process's telemetry, installed once by the binary. Dropping it (or
/// [`Telemetry::shutdown`]) flushes the spans not yet exported; keep it alive until the runtime
/// is about to stop.
#[must_use = "dropping the guard stops span export"]
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Flushes and stops span export (no-op without it).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: span export did not flush cleanly: {e}");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Targets kept quiet unless `RUST_LOG` asks for them.
const QUIET_BY_DEFAULT: &str = "lapin::returned_messages=error";

/// Installs the log subscriber (`RUST_LOG` if set, else `default_level`) and, when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set, span export for `service` (`OTEL_SERVICE_NAME`
/// overrides it). Must run inside the tokio runtime when export is requested; an export set-up
/// that cannot work (an unreadable CA bundle, say) is an error, not a silent no-op.
pub fn init(
    format: LogFormat,
    default_level: &str,
    service: &str,
    ca: Option<&crate::tls::ExtraCa>,
) -> Result<Telemetry, TelemetryError> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    // lapin warns about every message the broker returns and prints its body (a turn's
    // result): we handle returned messages ourselves and say so without the content.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{default_level},{QUIET_BY_DEFAULT}")));
    // Colours for a terminal (tracing-subscriber's own formatter); elsewhere the same line,
    // written without styles ([`plain`]).
    let colours = std::io::stderr().is_terminal();
    let text = (format == LogFormat::Text && colours).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(true)
    });
    let plain = (format == LogFormat::Text && !colours).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .fmt_fields(plain::PlainFields)
            .event_format(plain::PlainLine::with_timer(clock::UtcClock))
    });
    let json = (format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .with_ansi(false)
            .with_writer(std::io::stderr)
    });
    #[cfg(feature = "otel")]
    {
        let provider = if otlp::requested() {
            Some(otlp::provider(service, ca)?)
        } else {
            None
        };
        let spans = provider.as_ref().map(otlp::layer);
        // Err only when a subscriber is installed already (a second call): keep that one.
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(text)
            .with(plain)
            .with(json)
            .with(spans)
            .try_init();
        Ok(Telemetry { provider })
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = ca;
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(text)
            .with(plain)
            .with(json)
            .try_init();
        if EXPORT_VARS.iter().any(|v| std::env::var_os(v).is_some()) {
            tracing::warn!(
                service,
                "OTEL_EXPORTER_OTLP_ENDPOINT is set but this build has no span export (feature `otel`)"
            );
        }
        Ok(Telemetry {})
    }
}

#[cfg(test)]
mod tests {
    use super::LogFormat;

    #[test]
    fn the_format_is_text_json_or_a_clear_error() {
        assert_eq!(LogFormat::parse(None).ok(), Some(LogFormat::Text));
        assert_eq!(LogFormat::parse(Some("json")).ok(), Some(LogFormat::Json));
        assert_eq!(LogFormat::parse(Some(" text ")).ok(), Some(LogFormat::Text));
        let err = LogFormat::parse(Some("yaml")).unwrap_err().to_string();
        assert!(
            err.contains("APTIX_LOG_FORMAT") && err.contains("yaml"),
            "{err}"
        );
    }
}
