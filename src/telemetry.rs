//! Logs an operator can ship: `APTIX_LOG_FORMAT=text` (default) or `json`, levels from
//! `RUST_LOG`, always on stderr. JSON lines carry the timestamp, level, target, message, the
//! event's fields and the fields of the spans around it (`session_id`, `turn_id`, `attempt`,
//! `request_id`, …). Colour codes only when stderr is a terminal, never in a file or a pipe.
//!
//! Owns: installing the process's one subscriber. Must not: be called by library code.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

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
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value.map(str::trim) {
            None | Some("") | Some("text") => Ok(Self::Text),
            Some("json") => Ok(Self::Json),
            Some(other) => Err(format!(
                "APTIX_LOG_FORMAT must be \"text\" or \"json\", not {other:?}"
            )),
        }
    }
}

/// Installs the log subscriber: `RUST_LOG` if set, else `default_level`.
pub fn init(format: LogFormat, default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .with_ansi(false)
            .init(),
    }
}

#[cfg(test)]
mod tests {
    use super::LogFormat;

    #[test]
    fn the_format_is_text_json_or_a_clear_error() {
        assert_eq!(LogFormat::parse(None), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse(Some("json")), Ok(LogFormat::Json));
        assert_eq!(LogFormat::parse(Some(" text ")), Ok(LogFormat::Text));
        let err = LogFormat::parse(Some("yaml")).unwrap_err();
        assert!(
            err.contains("APTIX_LOG_FORMAT") && err.contains("yaml"),
            "{err}"
        );
    }
}
