//! Configuration parsing: every variable's default, value and refusal.

use super::*;
use crate::contract::RequestLimits;
use crate::sizing::{MAX_DEFAULT_CONCURRENCY, MIN_DEFAULT_CONCURRENCY, default_concurrency};
use std::collections::HashMap;
use std::time::Duration;

fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| map.get(k).cloned())
}

#[test]
fn defaults_need_no_environment() {
    let c = cfg(&[]).unwrap();
    assert_eq!(c.namespace, "aptix");
    assert!(c.broker.url.is_none() && c.store.url.is_none() && c.model.base_url.is_none());
    assert_eq!(c.limits.request, RequestLimits::default());
    assert_eq!(c.worker.concurrency, default_concurrency());
    assert!((MIN_DEFAULT_CONCURRENCY..=MAX_DEFAULT_CONCURRENCY).contains(&c.worker.concurrency));
    assert_eq!(c.broker.reply_queues, crate::queue::ReplyQueues::AsyncTurns);
    assert_eq!(
        c.topology().reply_queues,
        crate::queue::ReplyQueues::AsyncTurns
    );
}

#[test]
fn the_concurrency_setting_wins_over_the_default() {
    let c = cfg(&[("APTIX_CONCURRENCY", "7")]).unwrap();
    assert_eq!(c.worker.concurrency, 7);
}

#[test]
fn reply_queue_settings_parse_and_say_which_statuses_declare_a_queue() {
    use crate::queue::ReplyQueues::{AsyncTurns, EverySession, OnSubscribe};
    for (text, mode, for_wanted, for_unwanted) in [
        ("every-session", EverySession, true, true),
        ("async-turns", AsyncTurns, true, false),
        ("on-subscribe", OnSubscribe, false, false),
    ] {
        let c = cfg(&[("APTIX_REPLY_QUEUES", text)]).unwrap();
        assert_eq!(c.broker.reply_queues, mode);
        assert_eq!(mode.as_str(), text);
        assert_eq!(
            (mode.declared_for(true), mode.declared_for(false)),
            (for_wanted, for_unwanted),
            "{text}"
        );
    }
    let e = cfg(&[("APTIX_REPLY_QUEUES", "sometimes")]).unwrap_err();
    assert_eq!(e.var, "APTIX_REPLY_QUEUES");
    assert!(e.problem.contains("async-turns"), "{}", e.problem);
}

#[test]
fn retry_delays_are_milliseconds_in_order() {
    let c = cfg(&[("APTIX_RETRY_DELAYS_MS", "200, 400,1000")]).unwrap();
    assert_eq!(
        c.topology().retry_delays,
        [200, 400, 1000].map(Duration::from_millis).to_vec()
    );
    assert_eq!(
        cfg(&[]).unwrap().broker.retry_delays,
        crate::queue::Topology::new("x").retry_delays
    );
    for bad in ["0", "soon", "100,,200"] {
        let e = cfg(&[("APTIX_RETRY_DELAYS_MS", bad)]).unwrap_err();
        assert_eq!(e.var, "APTIX_RETRY_DELAYS_MS", "{bad}");
    }
}

#[test]
fn bad_values_name_the_variable() {
    let e = cfg(&[("APTIX_MAX_BODY_BYTES", "lots")]).unwrap_err();
    assert_eq!(e.var, "APTIX_MAX_BODY_BYTES");
    let e = cfg(&[("APTIX_CONCURRENCY", "0")]).unwrap_err();
    assert_eq!(e.var, "APTIX_CONCURRENCY");
    let e = cfg(&[("APTIX_NAMESPACE", "a b")]).unwrap_err();
    assert_eq!(e.var, "APTIX_NAMESPACE");
    let e = cfg(&[("APTIX_REDIS_MIN_REPLICAS", "one")]).unwrap_err();
    assert_eq!(e.var, "APTIX_REDIS_MIN_REPLICAS");
    let e = cfg(&[("APTIX_REDIS_REPLICA_TIMEOUT_MS", "0")]).unwrap_err();
    assert_eq!(e.var, "APTIX_REDIS_REPLICA_TIMEOUT_MS");
    let c = cfg(&[("APTIX_REDIS_MIN_REPLICAS", "2")]).unwrap();
    assert_eq!(c.store.min_replicas, 2);
    assert_eq!(cfg(&[]).unwrap().store.min_replicas, 0, "off by default");
}

#[test]
fn limits_are_configurable() {
    let c = cfg(&[("APTIX_MAX_INSTRUCTION_BYTES", "10")]).unwrap();
    assert_eq!(c.limits.request.max_instruction_bytes, 10);
}

#[test]
fn secrets_do_not_print() {
    let c = cfg(&[
        ("OPENAI_API_KEY", "sk-very-secret"),
        ("APTIX_API_TOKENS", "tok-secret=tenant-a"),
    ])
    .unwrap();
    let shown = format!("{c:?}");
    assert!(
        !shown.contains("sk-very-secret") && !shown.contains("tok-secret"),
        "{shown}"
    );
    assert!(shown.contains("tenant-a"));
    assert_eq!(c.http.api_tokens.tenant("tok-secret"), Some("tenant-a"));
    let e = cfg(&[("APTIX_API_TOKENS", "tok-secret")]).unwrap_err();
    assert!(!e.to_string().contains("tok-secret"));
}

#[test]
fn an_admin_token_is_marked_after_its_tenant_and_plain_entries_mean_what_they_did() {
    let c = cfg(&[("APTIX_API_TOKENS", "t1=acme, t2=ops:admin ,t3=acme")]).unwrap();
    let caller = |t| c.http.api_tokens.caller(t).cloned();
    assert_eq!(
        caller("t1"),
        Some(crate::tokens::Caller {
            tenant: "acme".into(),
            admin: false
        })
    );
    assert_eq!(
        caller("t2"),
        Some(crate::tokens::Caller {
            tenant: "ops".into(),
            admin: true
        })
    );
    assert_eq!(c.http.api_tokens.tenants(), vec!["acme", "ops"]);
    assert!(cfg(&[("APTIX_API_TOKENS", "t1=:admin")]).is_err());
}

#[test]
fn the_model_http_version_is_negotiated_unless_asked_and_a_bad_one_is_refused() {
    use crate::llm::ModelHttp;
    assert_eq!(
        cfg(&[]).unwrap().model.http,
        ModelHttp::Auto {
            streams: std::num::NonZeroUsize::new(100).unwrap()
        }
    );
    assert_eq!(
        cfg(&[("APTIX_LLM_HTTP", "http1")]).unwrap().model.http,
        ModelHttp::Http1
    );
    assert_eq!(
        cfg(&[("APTIX_LLM_HTTP2_STREAMS", "8")]).unwrap().model.http,
        ModelHttp::Auto {
            streams: std::num::NonZeroUsize::new(8).unwrap()
        }
    );
    let c = cfg(&[("APTIX_LLM_HTTP", "http2")]).unwrap();
    assert_eq!(
        c.model.http,
        ModelHttp::Http2 {
            streams: std::num::NonZeroUsize::new(100).unwrap()
        }
    );
    let c = cfg(&[
        ("APTIX_LLM_HTTP", "http2"),
        ("APTIX_LLM_HTTP2_STREAMS", "1"),
    ])
    .unwrap();
    assert_eq!(
        c.model.http,
        ModelHttp::Http2 {
            streams: std::num::NonZeroUsize::MIN
        }
    );
    let e = cfg(&[("APTIX_LLM_HTTP", "h2c")]).unwrap_err();
    assert_eq!(e.var, "APTIX_LLM_HTTP");
    assert!(e.to_string().contains("is not auto, http1 or http2"), "{e}");
    let e = cfg(&[
        ("APTIX_LLM_HTTP", "http2"),
        ("APTIX_LLM_HTTP2_STREAMS", "0"),
    ])
    .unwrap_err();
    assert_eq!(e.var, "APTIX_LLM_HTTP");
    assert!(e.to_string().contains("at least one stream"), "{e}");
}
