//! [`PlainLine`] and [`PlainFields`] against tracing-subscriber's own formatter with colours
//! off: the same events, with the same spans, must give the same bytes.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::layer::SubscriberExt as _;

use super::{PlainFields, PlainLine};

/// A clock that always reads the same, so two runs' lines can be compared.
#[derive(Clone, Copy)]
struct Frozen;

impl FormatTime for Frozen {
    fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
        w.write_str("2026-11-29T23:00:00.000001Z")
    }
}

/// A clock that cannot be read.
#[derive(Clone, Copy)]
struct Broken;

impl FormatTime for Broken {
    fn format_time(&self, _: &mut Writer<'_>) -> std::fmt::Result {
        Err(std::fmt::Error)
    }
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The lines `emit` logs through tracing-subscriber's formatter and through ours.
fn both<T: FormatTime + Clone + Send + Sync + 'static>(timer: T, emit: fn()) -> (String, String) {
    let theirs = Captured::default();
    let sink = theirs.clone();
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_timer(timer.clone())
        .with_writer(move || sink.clone());
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), emit);

    let ours = Captured::default();
    let sink = ours.clone();
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .fmt_fields(PlainFields)
        .event_format(PlainLine::with_timer(timer))
        .with_writer(move || sink.clone());
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), emit);
    (theirs.text(), ours.text())
}

fn assert_same(emit: fn()) -> String {
    let (theirs, ours) = both(Frozen, emit);
    assert!(!theirs.is_empty(), "nothing was logged");
    assert_eq!(ours, theirs);
    ours
}

#[derive(Debug)]
struct Failure {
    what: &'static str,
    cause: Option<Box<Failure>>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.what)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause.as_deref().map(|c| c as _)
    }
}

fn chain() -> Failure {
    Failure {
        what: "the turn could not be saved",
        cause: Some(Box::new(Failure {
            what: "redis: connection \x1b[31mrefused",
            cause: Some(Box::new(Failure {
                what: "os error 111",
                cause: None,
            })),
        })),
    }
}

#[test]
fn every_level_without_spans() {
    let out = assert_same(|| {
        tracing::trace!("t");
        tracing::debug!("d");
        tracing::info!("i");
        tracing::warn!("w");
        tracing::error!("e");
    });
    assert!(
        out.contains(" INFO aptix_worker::telemetry::plain::tests: i\n"),
        "{out}"
    );
}

#[test]
fn fields_of_every_kind() {
    let out = assert_same(|| {
        let text = "quoted \"and\" \x1b[1m";
        tracing::info!(
            session_id = "s-1",
            text,
            count = 3_i64,
            big = u64::MAX,
            wide = -7_i128,
            ratio = 0.25_f64,
            ok = true,
            shown = %"displayed \x1b",
            debugged = ?Some(4),
            r#type = "kind",
            "the turn {} ended",
            "t-1"
        );
        // A raw name as written (the macros take `r#` off an identifier themselves).
        tracing::info!("r#kind" = "raw", "r#message" = 1);
        tracing::info!(only = 1, "");
        tracing::info!(no_message = 1);
    });
    assert!(out.contains("the turn t-1 ended"), "{out}");
    assert!(out.contains("type=\"kind\""), "{out}");
    assert!(out.contains("kind=\"raw\" message=1"), "{out}");
}

#[test]
fn messages_are_escaped_as_theirs_are() {
    let out = assert_same(|| {
        tracing::warn!("bell \x07 back \x08 feed \x0c esc \x1b[2J del \x7f c1 \u{85}\u{9b} é ok");
        let owned = String::from("\x1b]0;title\x07");
        tracing::warn!(message = owned.as_str());
        tracing::warn!(message = %owned);
        tracing::warn!("{}", "clean text, nothing to escape");
    });
    assert!(!out.contains('\x1b'), "{out}");
    assert!(out.contains("\\x1b[2J") && out.contains("\\u{9b}"), "{out}");
}

#[test]
fn errors_with_and_without_sources() {
    let out = assert_same(|| {
        let err = chain();
        tracing::error!(
            error = &err as &(dyn std::error::Error + 'static),
            "save failed"
        );
        let alone = Failure {
            what: "alone \u{90}",
            cause: None,
        };
        tracing::error!(error = &alone as &(dyn std::error::Error + 'static));
        tracing::error!(message = &err as &(dyn std::error::Error + 'static));
    });
    assert!(out.contains("error.sources=["), "{out}");
}

#[test]
fn spans_nested_recorded_and_empty() {
    let out = assert_same(|| {
        let outer = tracing::info_span!(
            "turn",
            session_id = "s-1",
            attempt = 2,
            late = tracing::field::Empty
        );
        let _o = outer.enter();
        let inner = tracing::info_span!("model_call");
        let _i = inner.enter();
        tracing::info!(tokens = 12, "answered");
        outer.record("late", "recorded");
        tracing::info!("again");
        let third = tracing::debug_span!("tool", r#name = "search");
        let _t = third.enter();
        third.record("name", "lookup");
        tracing::debug!(message = "deep");
    });
    assert!(
        out.contains("turn{session_id=\"s-1\" attempt=2}:model_call: "),
        "{out}"
    );
    assert!(out.contains("late=\"recorded\""), "{out}");
}

#[test]
fn log_records_keep_their_target_and_drop_their_metadata_fields() {
    let out = assert_same(|| {
        let record = log::Record::builder()
            .args(format_args!("from the log crate \x1b"))
            .level(log::Level::Warn)
            .target("some_crate::module")
            .module_path_static(Some("some_crate::module"))
            .file_static(Some("src/module.rs"))
            .line(Some(42))
            .build();
        let _ = tracing_log::format_trace(&record);
    });
    assert!(
        out.contains(" WARN some_crate::module: from the log crate \\x1b\n"),
        "{out}"
    );
    assert!(!out.contains("log."), "{out}");
}

#[test]
fn a_clock_that_cannot_be_read_leaves_a_marker() {
    let (theirs, ours) = both(Broken, || tracing::info!("late"));
    assert_eq!(ours, theirs);
    assert!(ours.starts_with("<unknown time>  INFO "), "{ours}");
}
