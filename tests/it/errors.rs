//! Our error types name each cause once along their chain: a variant that writes a client's
//! error into its message does not also return it as its source, so a reporter that walks the
//! chain (a log formatter, `anyhow`'s `{:#}`, the CLI's error line) does not say it twice.

use std::error::Error;
use std::io;

use aptix_worker::causes::with_causes;
use aptix_worker::limiter::LimitStoreError;
use aptix_worker::llm::ClientError;
use aptix_worker::queue::QueueError;
use aptix_worker::rag::RagError;
use aptix_worker::store::StoreError;
use aptix_worker::tenants::QuotaError;

fn refused() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionRefused,
        "connection refused by 10.0.0.7",
    )
}

fn bad_json() -> serde_json::Error {
    serde_json::from_str::<u32>("[1").unwrap_err()
}

/// What [`bad_json`]'s error says.
const BAD_JSON: &str = "invalid type: sequence, expected u32";

/// Each link's text, outermost first.
fn chain(e: &(dyn Error + 'static)) -> Vec<String> {
    let mut texts = vec![e.to_string()];
    let mut next = e.source();
    while let Some(c) = next {
        texts.push(c.to_string());
        next = c.source();
    }
    texts
}

/// Every link adds something: none repeats the text of the link it wraps, and the innermost
/// cause's text is in the outermost message or further down the chain exactly once.
fn assert_named_once(e: &(dyn Error + 'static), cause: &str) {
    let links = chain(e);
    for pair in links.windows(2) {
        assert!(
            !pair[0].contains(&pair[1]),
            "{:?} repeats its source {:?} (whole chain: {links:?})",
            pair[0],
            pair[1]
        );
    }
    let line = links.join(": ");
    assert_eq!(
        line.matches(cause).count(),
        1,
        "the cause {cause:?} is not named exactly once in {line:?}"
    );
}

#[test]
fn broker_errors_name_their_cause_once() {
    let e = QueueError::Amqp(lapin::Error::from(refused()));
    assert_named_once(&e, "connection refused by 10.0.0.7");
    let e = QueueError::Encode(std::sync::Arc::new(bad_json()));
    assert_named_once(&e, BAD_JSON);
}

#[test]
fn store_errors_name_their_cause_once() {
    let e = StoreError::Redis(redis::RedisError::from(refused()));
    assert_named_once(&e, "connection refused by 10.0.0.7");
    let e = StoreError::Decode {
        key: "aptix:session:{s1}".into(),
        error: bad_json(),
    };
    assert_named_once(&e, BAD_JSON);
    assert!(e.to_string().contains("aptix:session:{s1}"), "{e}");
    let e = StoreError::Encode(bad_json());
    assert_named_once(&e, BAD_JSON);
}

#[test]
fn index_errors_name_their_cause_once() {
    let e = RagError::Redis(redis::RedisError::from(refused()));
    assert_named_once(&e, "connection refused by 10.0.0.7");
    let e = RagError::Decode {
        key: "aptix:rag:chunk:{t}:c1".into(),
        error: bad_json(),
    };
    assert_named_once(&e, BAD_JSON);
    let e = RagError::Folder {
        path: "/srv/docs".into(),
        error: refused(),
    };
    assert_named_once(&e, "connection refused by 10.0.0.7");
    assert!(e.to_string().contains("/srv/docs"), "{e}");
}

#[test]
fn model_client_and_quota_errors_name_their_cause_once() {
    let http = aptix_worker::tls::http_client_builder(None)
        .and_then(|b| b.build())
        .expect("a plain client")
        .get("not a url")
        .build()
        .expect_err("a relative URL is not a request");
    let said = http.to_string();
    let e = ClientError::Http(http);
    assert_named_once(&e, &said);
    let e = QuotaError::Unavailable(LimitStoreError("redis is loading".into()));
    assert_named_once(&e, "redis is loading");
}

/// What an operator reads on the CLI's error line, built from the same chain.
#[test]
fn the_error_line_says_each_cause_once() {
    let e = StoreError::Redis(redis::RedisError::from(refused()));
    let line = with_causes(&e);
    assert_eq!(
        line.matches("connection refused by 10.0.0.7").count(),
        1,
        "{line}"
    );
    assert!(line.starts_with("session store unavailable: "), "{line}");
}
