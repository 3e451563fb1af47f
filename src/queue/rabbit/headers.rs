//! What a job carries in its AMQP headers (attempt, reason, tenant, where to reply, webhooks,
//! batch) and the arguments of the delay queues.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::queue::JobMeta;

pub(super) const ATTEMPT_HEADER: &str = "x-aptix-attempt";
pub(super) const REASON_HEADER: &str = "x-aptix-reason";
pub(super) const TENANT_HEADER: &str = "x-aptix-tenant";
pub(super) const REPLY_TO_HEADER: &str = "x-aptix-reply-to";
/// Present (`none`) on a job whose submitter will not read the session's reply queue.
pub(super) const REPLY_QUEUE_HEADER: &str = "x-aptix-reply-queue";
/// The submission's own webhook URL, when it named one.
pub(super) const WEBHOOK_HEADER: &str = "x-aptix-webhook";
/// The batch a job is a line of, when that batch's completion is told of.
pub(super) const BATCH_HEADER: &str = "x-aptix-batch";

pub(super) fn table(pairs: Vec<(&str, AMQPValue)>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert(ShortString::from(k), v);
    }
    t
}

pub(super) fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// The arguments of a delay queue: a quorum queue whose messages wait `delay`, then are
/// dead-lettered (at least once) to `back_to`; full, it refuses publishes.
pub(super) fn delay_queue_args(delay: Duration, back_to: &str) -> FieldTable {
    table(vec![
        ("x-queue-type", text("quorum")),
        (
            "x-message-ttl",
            AMQPValue::LongLongInt(delay.as_millis() as i64),
        ),
        ("x-dead-letter-exchange", text("")),
        ("x-dead-letter-routing-key", text(back_to)),
        ("x-dead-letter-strategy", text("at-least-once")),
        ("x-overflow", text("reject-publish")),
    ])
}

/// A job message's headers: its retry count and, when known, its trace context and tenant.
pub(super) fn job_headers(meta: &JobMeta) -> FieldTable {
    let mut headers = vec![(ATTEMPT_HEADER, AMQPValue::LongUInt(meta.attempt))];
    if let Some(t) = &meta.traceparent {
        headers.push((crate::trace::TRACEPARENT, text(t)));
    }
    if let Some(t) = &meta.tenant {
        headers.push((TENANT_HEADER, text(t)));
    }
    if let Some(r) = &meta.reply_to {
        headers.push((REPLY_TO_HEADER, text(r)));
    }
    if !meta.reply_queue_wanted {
        headers.push((REPLY_QUEUE_HEADER, text("none")));
    }
    if let Some(w) = &meta.webhook {
        headers.push((WEBHOOK_HEADER, text(w)));
    }
    if let Some(b) = &meta.batch {
        headers.push((BATCH_HEADER, text(b)));
    }
    table(headers)
}

/// A text header of a delivered job, if it has one.
pub(super) fn text_header(props: &BasicProperties, name: &str) -> Option<String> {
    match props.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        _ => None,
    }
}

/// The headers a job was published with.
pub(super) fn meta_of(props: &BasicProperties) -> JobMeta {
    JobMeta {
        attempt: attempt_of(props),
        traceparent: text_header(props, crate::trace::TRACEPARENT),
        tenant: text_header(props, TENANT_HEADER),
        reply_to: text_header(props, REPLY_TO_HEADER),
        reply_queue_wanted: text_header(props, REPLY_QUEUE_HEADER).as_deref() != Some("none"),
        webhook: text_header(props, WEBHOOK_HEADER),
        batch: text_header(props, BATCH_HEADER),
    }
}

pub(super) fn attempt_of(props: &BasicProperties) -> u32 {
    props
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(ATTEMPT_HEADER).cloned())
        .and_then(|v| match v {
            AMQPValue::LongUInt(n) => Some(n),
            AMQPValue::LongLongInt(n) => u32::try_from(n).ok(),
            AMQPValue::LongInt(n) => u32::try_from(n).ok(),
            AMQPValue::ShortUInt(n) => Some(u32::from(n)),
            _ => None,
        })
        .unwrap_or(0)
}
