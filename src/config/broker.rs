//! `[broker]`: RabbitMQ, the job's retries and the per-session reply queues.

use std::time::Duration;

use super::setting::{Alias, Default, Kind, Reader, Setting, Unit};
use super::{ConfigError, Secret};
use crate::queue::ReplyQueues;

/// `APTIX_AMQP_URL`.
pub static URL: Setting = Setting {
    var: "APTIX_AMQP_URL",
    key: "broker.url",
    aliases: &[],
    kind: Kind::SecretUrls,
    default: Default::Unset,
    about: "RabbitMQ URL, or a cluster's node URLs comma-separated (connect to the first that \
            answers, move on when it goes); unset = the embedded in-memory queue",
};

/// `APTIX_MAX_ATTEMPTS`.
pub static MAX_ATTEMPTS: Setting = Setting {
    var: "APTIX_MAX_ATTEMPTS",
    key: "broker.max_attempts",
    aliases: &[],
    kind: Kind::Number,
    default: Default::Value("5"),
    about: "runs of a job (the first included) before it is dead-lettered with a failed result",
};

/// `APTIX_RETRY_DELAYS`.
pub static RETRY_DELAYS: Setting = Setting {
    var: "APTIX_RETRY_DELAYS",
    key: "broker.retry_delays",
    aliases: &[Alias {
        var: "APTIX_RETRY_DELAYS_MS",
        unit: Some(Unit::Millis),
    }],
    kind: Kind::Durations,
    default: Default::Value("1s,5s,15s,1m,5m"),
    about: "the wait before each retry of a failed job, in order (the last repeats); one delay \
            queue each, at most 20",
};

/// `APTIX_REPLY_QUEUES`.
pub static REPLY_QUEUES: Setting = Setting {
    var: "APTIX_REPLY_QUEUES",
    key: "broker.reply_queues",
    aliases: &[],
    kind: Kind::Choice(&["async-turns", "every-session", "on-subscribe"]),
    default: Default::Value("async-turns"),
    about: "which sessions get a durable reply queue: `async-turns` (a session with a turn \
            submitted to be read later gets one with that turn's status), `every-session` (the \
            worker declares one with every session's first status: the dearest thing a new \
            session costs RabbitMQ) or `on-subscribe` (only once a client subscribed); set every \
            process alike",
};

/// `APTIX_REPLY_QUEUE_TTL`.
pub static REPLY_QUEUE_TTL: Setting = Setting {
    var: "APTIX_REPLY_QUEUE_TTL",
    key: "broker.reply_queue_ttl",
    aliases: &[Alias {
        var: "APTIX_REPLY_QUEUE_TTL_SECS",
        unit: Some(Unit::Seconds),
    }],
    kind: Kind::Duration,
    default: Default::Value("1h"),
    about: "how long an unused per-session reply queue lives",
};

/// `APTIX_REPLY_QUEUE_MAX_LENGTH`.
pub static REPLY_QUEUE_MAX_LENGTH: Setting = Setting {
    var: "APTIX_REPLY_QUEUE_MAX_LENGTH",
    key: "broker.reply_queue_max_length",
    aliases: &[],
    kind: Kind::Number,
    default: Default::Value("1000"),
    about: "the most statuses a reply queue holds; the oldest are dropped beyond it",
};

/// The settings of this section.
pub static SETTINGS: &[&Setting] = &[
    &URL,
    &MAX_ATTEMPTS,
    &RETRY_DELAYS,
    &REPLY_QUEUES,
    &REPLY_QUEUE_TTL,
    &REPLY_QUEUE_MAX_LENGTH,
];

/// `[broker]`.
#[derive(Debug, Clone)]
pub struct Broker {
    /// RabbitMQ; `None` = the embedded in-memory queue.
    pub url: Option<Secret>,
    /// Runs of a job before it is dead-lettered.
    pub max_attempts: u32,
    /// The wait before each retry of a failed job (the last repeats).
    pub retry_delays: Vec<Duration>,
    /// Which sessions get a durable reply queue.
    pub reply_queues: ReplyQueues,
    /// How long an unused reply queue lives.
    pub reply_queue_ttl: Duration,
    /// The most statuses a reply queue holds.
    pub reply_queue_max_length: u32,
}

impl Broker {
    /// Reads the section.
    pub fn read(r: &Reader) -> Result<Self, ConfigError> {
        Ok(Self {
            url: r.text(&URL)?.map(Secret::new),
            max_attempts: r.positive(&MAX_ATTEMPTS)?,
            retry_delays: r.durations(&RETRY_DELAYS, 20)?,
            reply_queues: r
                .parse(&REPLY_QUEUES, |t, _| t.parse::<ReplyQueues>())?
                .unwrap_or(ReplyQueues::AsyncTurns),
            reply_queue_ttl: r.positive_duration(&REPLY_QUEUE_TTL)?,
            reply_queue_max_length: r.positive(&REPLY_QUEUE_MAX_LENGTH)?,
        })
    }
}
