//! The text log line when colours are off (stderr is a file or a pipe: every deployment), written
//! straight into the line's buffer. tracing-subscriber's default formatter writes the same line,
//! but sends each field name, `=`, `:` and the target through a terminal style even when that
//! style is plain, and escapes a message one character at a time: about 5,000 instructions a
//! turn in the front door and 9,000 in the worker (callgrind, 2026-11-29). This one writes the
//! same bytes (the tests compare the two on every kind of field) without either cost.
//!
//! A line: `<time> <LEVEL> <span>{<fields>}:<span>: <target>: <fields>`. A `message` field is
//! written bare, its terminal control characters (ESC, BEL, BS, FF, DEL and the C1 range)
//! escaped so a log line cannot drive an operator's terminal; other fields as `name=value`
//! (`Debug`), an error with its chain of sources; `log` records keep their own target and
//! level, their `log.*` fields dropped.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_log::NormalizeEvent as _;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Formats a span's or an event's fields: `name=value` separated by spaces, the message bare.
#[derive(Debug, Default, Clone, Copy)]
pub struct PlainFields;

impl<'w> FormatFields<'w> for PlainFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = FieldWriter {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

/// Formats an event's line around its fields (formatted by the layer's [`PlainFields`]).
#[derive(Debug, Clone, Copy)]
pub struct PlainLine<T> {
    timer: T,
}

impl<T> PlainLine<T> {
    /// A line whose time `timer` writes.
    pub fn with_timer(timer: T) -> Self {
        Self { timer }
    }
}

impl<S, N, T> FormatEvent<S, N> for PlainLine<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    T: FormatTime,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        // A clock that cannot be read does not cost the line.
        if self.timer.format_time(&mut writer).is_err() {
            writer.write_str("<unknown time>")?;
        }
        writer.write_char(' ')?;
        writer.write_str(level_name(meta.level()))?;
        writer.write_char(' ')?;
        if let Some(scope) = ctx.event_scope() {
            let mut any = false;
            for span in scope.from_root() {
                any = true;
                writer.write_str(span.metadata().name())?;
                let extensions = span.extensions();
                if let Some(fields) = extensions.get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    writer.write_char('{')?;
                    writer.write_str(&fields.fields)?;
                    writer.write_char('}')?;
                }
                writer.write_char(':')?;
            }
            if any {
                writer.write_char(' ')?;
            }
        }
        writer.write_str(meta.target())?;
        writer.write_str(": ")?;
        ctx.format_fields(writer.by_ref(), event)?;
        writer.write_char('\n')
    }
}

/// The level as the line shows it: five characters wide.
fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::TRACE => "TRACE",
        Level::DEBUG => "DEBUG",
        Level::INFO => " INFO",
        Level::WARN => " WARN",
        Level::ERROR => "ERROR",
    }
}

/// Writes one set of fields.
struct FieldWriter<'w> {
    writer: Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl FieldWriter<'_> {
    /// Writes `name=` (or nothing, for the message) after the space that separates fields.
    fn start(&mut self, name: &str) -> fmt::Result {
        if self.first {
            self.first = false;
        } else {
            self.writer.write_char(' ')?;
        }
        if name != "message" {
            self.writer
                .write_str(name.strip_prefix("r#").unwrap_or(name))?;
            self.writer.write_char('=')?;
        }
        Ok(())
    }

    fn field(&mut self, name: &str, value: &dyn fmt::Debug) -> fmt::Result {
        self.start(name)?;
        if name == "message" && self.writer.sanitizes_ansi_escapes() {
            write!(Escaping(&mut self.writer), "{value:?}")
        } else {
            write!(self.writer, "{value:?}")
        }
    }
}

impl Visit for FieldWriter<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        if name == "message" {
            self.result = self.start(name).and_then(|()| {
                if self.writer.sanitizes_ansi_escapes() {
                    Escaping(&mut self.writer).write_str(value)
                } else {
                    self.writer.write_str(value)
                }
            });
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let line = ErrorLine {
            name: field.name(),
            error: value,
            sanitize: self.writer.sanitizes_ansi_escapes(),
        };
        self.record_debug(field, &format_args!("{line}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        // A `log` record's metadata, already written as the line's target and level.
        if name.starts_with("log.") {
            return;
        }
        self.result = self.field(name, value);
    }
}

/// An error and, when it has any, its sources: `outer <field>.sources=[inner, root]`.
struct ErrorLine<'a> {
    name: &'a str,
    error: &'a (dyn std::error::Error + 'static),
    sanitize: bool,
}

impl fmt::Display for ErrorLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_error(f, self.error, self.sanitize)?;
        let Some(mut source) = self.error.source() else {
            return Ok(());
        };
        write!(f, " {}.sources=[", self.name)?;
        loop {
            write_error(f, source, self.sanitize)?;
            match source.source() {
                Some(next) => {
                    f.write_str(", ")?;
                    source = next;
                }
                None => break,
            }
        }
        f.write_char(']')
    }
}

fn write_error(
    f: &mut fmt::Formatter<'_>,
    error: &(dyn std::error::Error + 'static),
    sanitize: bool,
) -> fmt::Result {
    if sanitize {
        write!(Escaping(f), "{error}")
    } else {
        write!(f, "{error}")
    }
}

/// Passes text through with terminal control characters written as escapes (`\x1b`, and
/// `\u{85}` for the C1 range); text without any is passed on whole.
struct Escaping<'a, W: fmt::Write + ?Sized>(&'a mut W);

/// Whether `c` could start or steer a terminal escape sequence.
fn is_control(c: char) -> bool {
    matches!(
        c,
        '\x1b' | '\x07' | '\x08' | '\x0c' | '\x7f' | '\u{80}'..='\u{9f}'
    )
}

impl<W: fmt::Write + ?Sized> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Every character escaped is one of these bytes or starts with 0xC2 (U+0080..U+009F).
        let suspect = |b: &u8| matches!(b, 0x1b | 0x07 | 0x08 | 0x0c | 0x7f | 0xc2);
        if !s.as_bytes().iter().any(suspect) {
            return self.0.write_str(s);
        }
        let mut plain = 0;
        for (at, c) in s.char_indices() {
            if !is_control(c) {
                continue;
            }
            self.0.write_str(&s[plain..at])?;
            match c {
                '\x1b' => self.0.write_str("\\x1b")?,
                '\x07' => self.0.write_str("\\x07")?,
                '\x08' => self.0.write_str("\\x08")?,
                '\x0c' => self.0.write_str("\\x0c")?,
                '\x7f' => self.0.write_str("\\x7f")?,
                c => write!(self.0, "\\u{{{:x}}}", u32::from(c))?,
            }
            plain = at + c.len_utf8();
        }
        self.0.write_str(&s[plain..])
    }
}

#[cfg(test)]
#[path = "plain_tests.rs"]
mod tests;
