//! `[model]`: the model server, how calls are made, and the agent contexts' limits.

use std::path::Path;
use std::time::Duration;

use super::setting::{Alias, Default, Kind, Reader, Setting, Unit, parse_duration};
use super::{ConfigError, Secret};
use crate::causes::with_causes;
use crate::contexts::{CallSettings, Contexts, Prices, ServiceTier};

/// `APTIX_LLM_BASE_URL`.
pub static BASE_URL: Setting = Setting {
    var: "APTIX_LLM_BASE_URL",
    key: "model.base_url",
    aliases: &[],
    kind: Kind::Text,
    default: Default::Unset,
    about: "Responses API base, e.g. `https://api.openai.com/v1`; unset = OpenAI when \
            `OPENAI_API_KEY` is set, else the built-in fake model",
};

/// `OPENAI_API_KEY`.
pub static API_KEY: Setting = Setting {
    var: "OPENAI_API_KEY",
    key: "model.api_key",
    aliases: &[],
    kind: Kind::Secret,
    default: Default::Unset,
    about: "the model server's key",
};

/// `APTIX_MODEL`.
pub static NAME: Setting = Setting {
    var: "APTIX_MODEL",
    key: "model.name",
    aliases: &[],
    kind: Kind::Text,
    default: Default::Value("gpt-4o-mini"),
    about: "the model sent on every call of the `default` agent context",
};

/// `APTIX_LLM_TIMEOUT`.
pub static TIMEOUT: Setting = Setting {
    var: "APTIX_LLM_TIMEOUT",
    key: "model.timeout",
    aliases: &[Alias {
        var: "APTIX_LLM_TIMEOUT_SECS",
        unit: Some(Unit::Seconds),
    }],
    kind: Kind::Duration,
    default: Default::Value("120s"),
    about: "how long one model call may take before it is abandoned (and retried)",
};

/// `APTIX_LLM_CONNECT_TIMEOUT`.
pub static CONNECT_TIMEOUT: Setting = Setting {
    var: "APTIX_LLM_CONNECT_TIMEOUT",
    key: "model.connect_timeout",
    aliases: &[Alias {
        var: "APTIX_LLM_CONNECT_TIMEOUT_SECS",
        unit: Some(Unit::Seconds),
    }],
    kind: Kind::Duration,
    default: Default::Value("10s"),
    about: "how long connecting to the model server may take",
};

/// `APTIX_LLM_HTTP`.
pub static HTTP: Setting = Setting {
    var: "APTIX_LLM_HTTP",
    key: "model.http",
    aliases: &[],
    kind: Kind::Text,
    default: Default::Value("auto"),
    about: "how calls reach every agent context's model server: `auto` (on `https://` the \
            server chooses by ALPN, HTTP/2 if it offers it, else HTTP/1.1; on `http://`, \
            HTTP/1.1), `http1` (a connection per call in flight) or `http2` (always, by prior \
            knowledge on `http://`; a server that does not speak it fails every call). Over \
            HTTP/2 the calls are streams on as few connections as `model.http2_streams` \
            allows (fewer sockets; about the same memory per call as HTTP/1.1)",
};

/// `APTIX_LLM_HTTP2_STREAMS`.
pub static HTTP2_STREAMS: Setting = Setting {
    var: "APTIX_LLM_HTTP2_STREAMS",
    key: "model.http2_streams",
    aliases: &[],
    kind: Kind::Number,
    default: Default::Value("100"),
    about: "the calls one HTTP/2 connection carries before another is opened (at most the \
            server's `SETTINGS_MAX_CONCURRENT_STREAMS`, often 100, or calls wait for a stream)",
};

/// `APTIX_LLM_MAX_RETRIES`.
pub static MAX_RETRIES: Setting = Setting {
    var: "APTIX_LLM_MAX_RETRIES",
    key: "model.max_retries",
    aliases: &[],
    kind: Kind::Number,
    default: Default::Value("2"),
    about: "retries of one model call after the first attempt",
};

/// `APTIX_LLM_REPLAY`.
pub static REPLAY: Setting = Setting {
    var: "APTIX_LLM_REPLAY",
    key: "model.replay",
    aliases: &[],
    kind: Kind::Flag,
    default: Default::Value("false"),
    about: "send the stored conversation on every call instead of `previous_response_id` (for \
            servers that keep no responses)",
};

/// `APTIX_LLM_STREAMING`.
pub static STREAMING: Setting = Setting {
    var: "APTIX_LLM_STREAMING",
    key: "model.streaming",
    aliases: &[],
    kind: Kind::Flag,
    default: Default::Value("true"),
    about: "call the model with `\"stream\": true` for turns that ask for streaming; `false` for \
            servers without streaming",
};

/// `APTIX_LLM_BACKGROUND`.
pub static BACKGROUND: Setting = Setting {
    var: "APTIX_LLM_BACKGROUND",
    key: "model.background",
    aliases: &[],
    kind: Kind::Flag,
    default: Default::Value("false"),
    about: "the `default` context's calls are made in background mode and survive the worker \
            (per context: `background`)",
};

/// `APTIX_LLM_SERVICE_TIER`.
pub static SERVICE_TIER: Setting = Setting {
    var: "APTIX_LLM_SERVICE_TIER",
    key: "model.service_tier",
    aliases: &[],
    kind: Kind::Choice(&["auto", "default", "flex", "priority"]),
    default: Default::Unset,
    about: "the `service_tier` of the `default` context's calls; unset sends none (per context: \
            `serviceTier`)",
};

/// `APTIX_LLM_FLEX_FALLBACK`.
pub static FLEX_FALLBACK: Setting = Setting {
    var: "APTIX_LLM_FLEX_FALLBACK",
    key: "model.flex_fallback",
    aliases: &[Alias {
        var: "APTIX_LLM_FLEX_FALLBACK_SECS",
        unit: Some(Unit::Seconds),
    }],
    kind: Kind::Duration,
    default: Default::Value("60s"),
    about: "how long a `flex` call refused for capacity is retried before it is made at \
            `default`; `never` keeps it at flex (per context: `flexFallbackAfterSecs`)",
};

/// `APTIX_LLM_PRICES`.
pub static PRICES: Setting = Setting {
    var: "APTIX_LLM_PRICES",
    key: "model.prices",
    aliases: &[],
    kind: Kind::Text,
    default: Default::Unset,
    about: "`input,cachedInput,output` dollars per million tokens of the `default` context \
            (`2,0.5,8`): every turn then carries its estimated cost (per context: `prices`)",
};

/// `APTIX_CONTEXTS_FILE`.
pub static CONTEXTS_FILE: Setting = Setting {
    var: "APTIX_CONTEXTS_FILE",
    key: "model.contexts_file",
    aliases: &[],
    kind: Kind::Path,
    default: Default::Unset,
    about: "agent and conversation contexts (JSON, see docs/models.md), read and checked at \
            start-up; the built-in `default`s are added where it has none",
};

/// `APTIX_RATE_WINDOW`.
pub static RATE_WINDOW: Setting = Setting {
    var: "APTIX_RATE_WINDOW",
    key: "model.rate_window",
    aliases: &[Alias {
        var: "APTIX_RATE_WINDOW_MS",
        unit: Some(Unit::Millis),
    }],
    kind: Kind::Duration,
    default: Default::Value("1m"),
    about: "the window `requestsPerMinute` counts in; change it only for tests and demos",
};

/// `APTIX_CAPACITY_WAIT`.
pub static CAPACITY_WAIT: Setting = Setting {
    var: "APTIX_CAPACITY_WAIT",
    key: "model.capacity_wait",
    aliases: &[Alias {
        var: "APTIX_CAPACITY_WAIT_MS",
        unit: Some(Unit::Millis),
    }],
    kind: Kind::Duration,
    default: Default::Value("30s"),
    about: "how long a model call waits for its agent context's limits before the turn goes back \
            to the queue",
};

/// `APTIX_CALL_SLOT_TTL`.
pub static CALL_SLOT_TTL: Setting = Setting {
    var: "APTIX_CALL_SLOT_TTL",
    key: "model.call_slot_ttl",
    aliases: &[Alias {
        var: "APTIX_CALL_SLOT_TTL_MS",
        unit: Some(Unit::Millis),
    }],
    kind: Kind::Duration,
    default: Default::Value("30s"),
    about: "how long a concurrency slot (of a context's calls, or a tenant's running turns) \
            outlives a worker that died holding it; live holders renew theirs",
};

/// The settings of this section.
pub static SETTINGS: &[&Setting] = &[
    &BASE_URL,
    &API_KEY,
    &NAME,
    &TIMEOUT,
    &CONNECT_TIMEOUT,
    &HTTP,
    &HTTP2_STREAMS,
    &MAX_RETRIES,
    &REPLAY,
    &STREAMING,
    &BACKGROUND,
    &SERVICE_TIER,
    &FLEX_FALLBACK,
    &PRICES,
    &CONTEXTS_FILE,
    &RATE_WINDOW,
    &CAPACITY_WAIT,
    &CALL_SLOT_TTL,
];

/// `[model]`.
#[derive(Debug, Clone)]
pub struct Model {
    /// Responses API base; `None` = OpenAI with a key, else the embedded fake model.
    pub base_url: Option<String>,
    /// The model server's key.
    pub api_key: Option<Secret>,
    /// The model name sent on every call.
    pub name: String,
    /// How long one model call may take.
    pub timeout: Duration,
    /// How long connecting to the model server may take.
    pub connect_timeout: Duration,
    /// The HTTP version calls are made over, and how many a connection carries.
    pub http: crate::llm::ModelHttp,
    /// Retries of one model call after the first attempt.
    pub max_retries: usize,
    /// Send the stored conversation instead of `previous_response_id`.
    pub replay: bool,
    /// Call the model with `stream: true` for turns that ask for streaming.
    pub streaming: bool,
    /// How the built-in `default` agent context's calls are made (the contexts file sets these
    /// per context).
    pub calls: CallSettings,
    /// Agent and conversation contexts.
    pub contexts: Contexts,
    /// The window `requestsPerMinute` counts in.
    pub rate_window: Duration,
    /// How long a model call waits for its context's capacity.
    pub capacity_wait: Duration,
    /// How long a concurrency slot outlives a worker that died holding it.
    pub call_slot_ttl: Duration,
}

impl Model {
    /// Reads the section.
    pub fn read(r: &Reader) -> Result<Self, ConfigError> {
        let sources = r.sources();
        Ok(Self {
            base_url: r
                .text(&BASE_URL)?
                .map(|u| u.trim_end_matches('/').to_string()),
            api_key: r.text(&API_KEY)?.map(Secret::new),
            name: r.text(&NAME)?.unwrap_or_default(),
            timeout: r.duration(&TIMEOUT)?,
            connect_timeout: r.duration(&CONNECT_TIMEOUT)?,
            http: {
                let streams = r.number(&HTTP2_STREAMS)?;
                r.parse(&HTTP, |t, _| crate::llm::ModelHttp::parse(t, streams))?
                    .unwrap_or_default()
            },
            max_retries: r.number(&MAX_RETRIES)?,
            replay: r.flag(&REPLAY)?,
            streaming: r.flag(&STREAMING)?,
            calls: CallSettings {
                background: r.flag(&BACKGROUND)?,
                service_tier: r.parse(&SERVICE_TIER, |t, _| {
                    ServiceTier::parse(t)
                        .ok_or_else(|| format!("{t:?} is not auto, default, flex or priority"))
                })?,
                flex_fallback: r
                    .parse(&FLEX_FALLBACK, |t, unit| match t {
                        "never" => Ok(None),
                        t => parse_duration(t, unit).map(Some),
                    })?
                    .flatten(),
                prices: r.parse(&PRICES, |t, _| Prices::parse_list(t))?,
                // Hosted tools are a contexts file's: the environment's default has none.
                hosted_tools: Vec::new(),
            },
            contexts: r
                .parse(&CONTEXTS_FILE, |path, _| {
                    Contexts::load(Path::new(path), |k| sources.env_raw(k))
                        .map_err(|e| with_causes(&e))
                })?
                .unwrap_or_else(Contexts::empty),
            rate_window: r.positive_duration(&RATE_WINDOW)?,
            capacity_wait: r.duration(&CAPACITY_WAIT)?,
            call_slot_ttl: r.positive_duration(&CALL_SLOT_TTL)?,
        })
    }

    /// The model server to use: the base URL, else OpenAI when a key is set, else `None` (the
    /// caller starts the embedded fake model).
    pub fn server(&self) -> Option<String> {
        self.base_url.clone().or_else(|| {
            self.api_key
                .as_ref()
                .map(|_| "https://api.openai.com/v1".to_string())
        })
    }
}
