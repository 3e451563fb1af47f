//! W3C trace context (`traceparent`) across the queue: the front door takes the caller's (or
//! starts a trace), the job message carries it as an AMQP header, the worker restores it as the
//! turn's context (its trace id is a field of the turn's span, so every log line of the turn
//! has it), and each model call sends it on with the same trace id and a new span id.
//!
//! When spans are exported (`OTEL_EXPORTER_OTLP_ENDPOINT`), the spans on that path — the front
//! door's `http`, the worker's `job`, the `model_call` — join the same trace: each adopts the
//! context it received as its parent ([`TraceContext::adopt`]) and passes its own span id on
//! ([`TraceContext::within`]), so the collector shows one tree from the caller to the model.
//!
//! Owns: parsing and minting contexts, and the context of the running turn (a task-local).
//! Must not: log or export anything itself.

/// The header name, in HTTP and on job messages.
pub const TRACEPARENT: &str = "traceparent";

/// One position in a trace: `00-<trace id>-<span id>-<flags>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: String,
    span_id: String,
    flags: String,
}

tokio::task_local! {
    static CURRENT: TraceContext;
}

/// `bytes` random bytes (at most 16) as lowercase hex, never all zeros (W3C's invalid id).
/// The ids tell traces and spans apart and guard nothing, so the thread's fast generator
/// serves (a fresh UUID per id asked the operating system's source: a system call each).
fn random_hex(bytes: usize) -> String {
    let mut random = [0u8; 16];
    let random = &mut random[..bytes.min(16)];
    while random.iter().all(|b| *b == 0) {
        fastrand::fill(random);
    }
    crate::hex::lower(random)
}

fn lower_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl TraceContext {
    /// A new trace (nobody sent one).
    pub fn new_root() -> Self {
        Self {
            trace_id: random_hex(16),
            span_id: random_hex(8),
            flags: "01".into(),
        }
    }

    /// Reads a `traceparent` value; `None` for anything the W3C format does not allow
    /// (a caller's malformed header starts a new trace instead).
    pub fn parse(header: &str) -> Option<Self> {
        let mut parts = header.trim().split('-');
        let (version, trace_id, span_id, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let valid = lower_hex(version, 2)
            && version != "ff"
            && lower_hex(trace_id, 32)
            && trace_id.bytes().any(|b| b != b'0')
            && lower_hex(span_id, 16)
            && span_id.bytes().any(|b| b != b'0')
            && lower_hex(flags, 2)
            && (version != "00" || parts.next().is_none());
        valid.then(|| Self {
            trace_id: trace_id.into(),
            span_id: span_id.into(),
            flags: flags.into(),
        })
    }

    /// The caller's context if it sent a valid one, else a new trace.
    pub fn from_header(header: Option<&str>) -> Self {
        header.and_then(Self::parse).unwrap_or_else(Self::new_root)
    }

    /// The same trace, one step further (a new span id).
    pub fn child(&self) -> Self {
        Self {
            trace_id: self.trace_id.clone(),
            span_id: random_hex(8),
            flags: self.flags.clone(),
        }
    }

    /// The trace id (32 hex digits).
    pub fn trace_id(&self) -> &str {
        &self.trace_id
    }

    /// The span id (16 hex digits).
    pub fn span_id(&self) -> &str {
        &self.span_id
    }

    /// The `traceparent` header value.
    pub fn header(&self) -> String {
        format!("00-{}-{}-{}", self.trace_id, self.span_id, self.flags)
    }

    /// Runs `fut` as part of this trace: [`TraceContext::current`] returns it there. (Not an
    /// `async fn`: one would hold `fut` twice, as its argument and inside the scope.)
    pub fn scope<F: std::future::Future>(
        self,
        fut: F,
    ) -> impl std::future::Future<Output = F::Output> {
        CURRENT.scope(self, fut)
    }

    /// The context of the turn running on this task, if any.
    pub fn current() -> Option<Self> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// Makes `span` a child of this context in the exported trace (call it before the span is
    /// first entered). Without span export it does nothing.
    pub fn adopt(&self, span: &tracing::Span) {
        #[cfg(feature = "otel")]
        {
            use opentelemetry::trace::{
                SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
            };
            use tracing_opentelemetry::OpenTelemetrySpanExt as _;
            let (Ok(trace_id), Ok(span_id), Ok(flags)) = (
                TraceId::from_hex(&self.trace_id),
                SpanId::from_hex(&self.span_id),
                u8::from_str_radix(&self.flags, 16),
            ) else {
                return;
            };
            let remote = SpanContext::new(
                trace_id,
                span_id,
                TraceFlags::new(flags),
                true,
                TraceState::default(),
            );
            // Err when the span is disabled or export is off: nothing to join then.
            let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
        }
        #[cfg(not(feature = "otel"))]
        let _ = span;
    }

    /// The context to pass on from inside `span`: the exported span's own ids when spans are
    /// exported, else this context one step further ([`TraceContext::child`]).
    pub fn within(&self, span: &tracing::Span) -> Self {
        #[cfg(feature = "otel")]
        {
            use opentelemetry::trace::TraceContextExt as _;
            use tracing_opentelemetry::OpenTelemetrySpanExt as _;
            let cx = span.context();
            let own = cx.span().span_context().clone();
            if own.is_valid() {
                return Self {
                    trace_id: format!("{:032x}", own.trace_id()),
                    span_id: format!("{:016x}", own.span_id()),
                    flags: format!("{:02x}", own.trace_flags().to_u8()),
                };
            }
        }
        #[cfg(not(feature = "otel"))]
        let _ = span;
        self.child()
    }
}

#[cfg(test)]
mod tests {
    use super::TraceContext;

    #[test]
    fn parses_the_w3c_format_and_refuses_the_rest() {
        let h = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let t = TraceContext::parse(h).expect("valid");
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.header(), h);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(TraceContext::parse(bad).is_none(), "{bad:?}");
        }
        let child = t.child();
        assert_eq!(child.trace_id(), t.trace_id());
        assert_ne!(child.span_id(), t.span_id());
        let root = TraceContext::new_root();
        assert!(TraceContext::parse(&root.header()).is_some());
    }

    /// New traces are valid and apart, within a thread and across threads (each seeds its own
    /// generator).
    #[test]
    fn new_traces_are_valid_and_distinct_across_threads() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    (0..2000)
                        .map(|_| {
                            let root = TraceContext::new_root();
                            assert!(TraceContext::parse(&root.header()).is_some(), "{root:?}");
                            (root.trace_id().to_string(), root.span_id().to_string())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let ids: Vec<(String, String)> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let traces: std::collections::HashSet<_> = ids.iter().map(|(t, _)| t).collect();
        let spans: std::collections::HashSet<_> = ids.iter().map(|(_, s)| s).collect();
        assert_eq!((traces.len(), spans.len()), (ids.len(), ids.len()));
    }
}
