//! The families of the MCP server tools (`aptix_tool_*`): each source's state, and each
//! tool's calls by outcome with their latency.
//!
//! Owns: those families and how they are counted. Must not: know anything of MCP itself.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// `source="…"`.
type SourceLabel = [(&'static str, String); 1];
/// `source="…",tool="…",outcome="…"`.
type CallLabels = [(&'static str, String); 3];

/// What a server tool call came to, as `aptix_tool_calls_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolOutcome {
    /// The tool answered.
    Answered,
    /// The tool answered with `isError: true`.
    ToolError,
    /// The arguments did not match the tool's schema; the server was not called.
    Rejected,
    /// It could not run (source down, protocol error, timeout): the turn is retried.
    Failed,
    /// Made again after a crash left its outcome unknown (the tool is safe to repeat).
    Repeated,
    /// Not made again after a crash left its outcome unknown (the tool may not repeat).
    RepeatRefused,
    /// Not run yet: the turn asks a person to approve it.
    ApprovalAsked,
    /// A person approved it (it then runs).
    Approved,
    /// A person denied it; the model is told.
    Denied,
}

impl ToolOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::ToolError => "tool_error",
            Self::Rejected => "rejected",
            Self::Failed => "failed",
            Self::Repeated => "repeated",
            Self::RepeatRefused => "repeat_refused",
            Self::ApprovalAsked => "approval_asked",
            Self::Approved => "approved",
            Self::Denied => "denied",
        }
    }
}

/// The server tools' families.
#[derive(Debug, Clone)]
pub struct ToolFamilies {
    up: Family<SourceLabel, Gauge>,
    tools: Family<SourceLabel, Gauge>,
    calls: Family<CallLabels, Counter>,
    latency: Family<SourceLabel, Histogram, fn() -> Histogram>,
}

fn latency_histogram() -> Histogram {
    Histogram::new(super::seconds_buckets())
}

impl ToolFamilies {
    /// The families, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let this = Self {
            up: Family::default(),
            tools: Family::default(),
            calls: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
        };
        registry.register(
            "tool_source_up",
            "Whether an MCP tool source (APTIX_TOOLS_FILE) is connected and has listed its tools: 1 or 0",
            this.up.clone(),
        );
        registry.register(
            "tool_source_tools",
            "The tools an MCP source offers after its allow-list, as last listed",
            this.tools.clone(),
        );
        registry.register(
            "tool_calls",
            "MCP server tool calls by source, tool and outcome (answered, tool_error, rejected, failed, repeated, repeat_refused, approval_asked, approved, denied)",
            this.calls.clone(),
        );
        registry.register(
            "tool_call_duration_seconds",
            "Time one MCP tool call took, to its answer or its failure, by source",
            this.latency.clone(),
        );
        this
    }

    /// Source `source` is up (or down) and offers `tools` tools.
    pub fn source(&self, source: &str, up: bool, tools: usize) {
        let label = [("source", source.to_string())];
        self.up.get_or_create(&label).set(i64::from(up));
        self.tools
            .get_or_create(&label)
            .set(i64::try_from(tools).unwrap_or(i64::MAX));
    }

    /// Source `source` listed `tools`: their `answered` and `failed` series, and the source's
    /// latency, exist from now on at zero (rates and alerts over them mean something from the
    /// first scrape).
    pub fn listed<'a>(&self, source: &str, tools: impl IntoIterator<Item = &'a str>) {
        for tool in tools {
            for outcome in [ToolOutcome::Answered, ToolOutcome::Failed] {
                self.calls
                    .get_or_create(&[
                        ("source", source.to_string()),
                        ("tool", tool.to_string()),
                        ("outcome", outcome.as_str().to_string()),
                    ])
                    .inc_by(0);
            }
        }
        let _ = self
            .latency
            .get_or_create(&[("source", source.to_string())]);
    }

    /// A call of `tool` at `source` came to `outcome`, after `took` (`None`: nothing was sent).
    pub fn call(
        &self,
        source: &str,
        tool: &str,
        outcome: ToolOutcome,
        took: Option<std::time::Duration>,
    ) {
        self.calls
            .get_or_create(&[
                ("source", source.to_string()),
                ("tool", tool.to_string()),
                ("outcome", outcome.as_str().to_string()),
            ])
            .inc();
        if let Some(took) = took {
            self.latency
                .get_or_create(&[("source", source.to_string())])
                .observe(took.as_secs_f64());
        }
    }
}
