//! The layers and the declarations: every variable users set keeps working, older names read
//! in their unit, the file under the environment, where each value came from, the reference.

use std::collections::HashMap;
use std::time::Duration;

use super::setting::{Default, Unit, format_duration, parse_duration};
use super::*;

fn read(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(move |k| map.get(k).cloned())
}

/// Every typed value of a configuration (not where they came from), to compare two.
fn typed(c: &Config) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        c.namespace,
        c.tls_ca.is_some(),
        c.dependency_timeout,
        c.broker,
        c.store,
        c.model,
        c.worker,
        c.http,
        c.limits,
        c.rag,
        c.webhooks,
        c.telemetry
    )
}

/// The variables the README documented before the configuration had sections, each with a
/// value other than its default: every one must still be read, and change what it changed.
const DOCUMENTED: &[(&str, &str)] = &[
    ("APTIX_NAMESPACE", "other"),
    ("APTIX_AMQP_URL", "amqp://u:p@h:5672/%2f"),
    ("APTIX_REDIS_URL", "redis://h:6379/"),
    ("APTIX_REDIS_CLUSTER", "true"),
    ("APTIX_REDIS_MIN_REPLICAS", "1"),
    ("APTIX_REDIS_REPLICA_TIMEOUT_MS", "250"),
    ("APTIX_LLM_BASE_URL", "http://model:1/v1"),
    ("OPENAI_API_KEY", "sk-x"),
    ("APTIX_MODEL", "gpt-x"),
    ("APTIX_LLM_TIMEOUT_SECS", "7"),
    ("APTIX_LLM_CONNECT_TIMEOUT_SECS", "3"),
    ("APTIX_LLM_MAX_RETRIES", "5"),
    ("APTIX_MAX_ITERATIONS", "3"),
    ("APTIX_CONCURRENCY", "5"),
    ("APTIX_LANE_WAIT_MS", "1500"),
    ("APTIX_CAPACITY_WAIT_MS", "100"),
    ("APTIX_CALL_SLOT_TTL_MS", "900"),
    ("APTIX_RATE_WINDOW_MS", "1000"),
    ("APTIX_LEASE_SECS", "9"),
    ("APTIX_RESULT_TTL_SECS", "60"),
    ("APTIX_SESSION_TTL_SECS", "120"),
    ("APTIX_MAX_ATTEMPTS", "2"),
    ("APTIX_RETRY_DELAYS_MS", "100,200"),
    ("APTIX_TURN_DEADLINE_SECS", "30"),
    ("APTIX_SHUTDOWN_GRACE_SECS", "2"),
    ("APTIX_REPLY_QUEUE_TTL_SECS", "60"),
    ("APTIX_REPLY_QUEUE_MAX_LENGTH", "10"),
    ("APTIX_REPLY_QUEUES", "every-session"),
    ("APTIX_LLM_REPLAY", "true"),
    ("APTIX_LLM_STREAMING", "false"),
    ("APTIX_CONSOLE", "true"),
    ("APTIX_LLM_BACKGROUND", "true"),
    ("APTIX_LLM_SERVICE_TIER", "flex"),
    ("APTIX_LLM_FLEX_FALLBACK_SECS", "never"),
    ("APTIX_LLM_PRICES", "2,0.5,8"),
    ("APTIX_API_TOKENS", "t=acme"),
    ("APTIX_MAX_BODY_BYTES", "1000"),
    ("APTIX_HTTP_READ_TIMEOUT_SECS", "2.5"),
    ("APTIX_MAX_INSTRUCTION_BYTES", "100"),
    ("APTIX_MAX_ARTIFACT_BYTES", "100"),
    ("APTIX_MAX_IMAGE_BYTES", "100"),
    ("APTIX_MAX_BATCH_BYTES", "100"),
    ("APTIX_MAX_BATCH_LINES", "10"),
    ("APTIX_RAG_MAX_CHUNKS", "0"),
    ("APTIX_RAG_MAX_CHARS", "100"),
    ("APTIX_RAG_CHUNK_LINES", "5"),
    ("APTIX_CPU_SCHEDULING", "batch"),
    ("APTIX_LOG_FORMAT", "json"),
    ("APTIX_DEPENDENCY_TIMEOUT_MS", "500"),
    ("APTIX_WEBHOOK_ALLOW_HTTP", "true"),
    ("APTIX_WEBHOOK_ALLOW", "10.0.0.0/8"),
    ("APTIX_WEBHOOK_TIMEOUT_SECS", "3"),
    ("APTIX_WEBHOOK_CONCURRENCY", "4"),
    ("APTIX_WEBHOOK_RETRY_DELAYS_SECS", "1,2"),
    ("APTIX_WEBHOOK_GIVE_UP_SECS", "60"),
    (
        "APTIX_WEBHOOK_SECRET",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    ),
];

#[test]
fn every_documented_variable_is_still_read_and_changes_what_it_changed() {
    let defaults = typed(&read(&[]).unwrap());
    for (var, value) in DOCUMENTED {
        let c = read(&[(var, value)]).unwrap_or_else(|e| panic!("{var}={value}: {e}"));
        assert_ne!(typed(&c), defaults, "{var}={value} changed nothing");
        let e = c
            .effective()
            .iter()
            .find(|e| e.origin == Origin::Env(var))
            .unwrap_or_else(|| panic!("{var} is not recorded as read from the environment"));
        assert!(
            e.setting.var == *var || e.setting.aliases.iter().any(|a| a.var == *var),
            "{var} recorded under {}",
            e.setting.var
        );
    }
    // The files' variables are read too (their loaders have tests of their own).
    for var in [
        "APTIX_CONTEXTS_FILE",
        "APTIX_TENANTS_FILE",
        "APTIX_TLS_CA_FILE",
    ] {
        let e = read(&[(var, "/nonexistent/aptix-file")]).unwrap_err();
        assert_eq!(e.var, var);
    }
    let c = read(&[("APTIX_MODES_FILE", "/etc/modes.json")]).unwrap();
    assert_eq!(c.worker.modes_file.as_deref(), Some("/etc/modes.json"));
}

#[test]
fn an_older_name_reads_a_bare_number_in_its_unit_and_the_new_name_wants_a_unit() {
    for s in ALL.iter().flat_map(|g| g.iter()) {
        for alias in s.aliases {
            let unit = match alias.unit {
                Some(Unit::Seconds) => "s",
                Some(Unit::Millis) => "ms",
                None => continue,
            };
            let old = read(&[(alias.var, "7")]).unwrap();
            let new = read(&[(s.var, &format!("7{unit}"))]).unwrap();
            assert_eq!(typed(&old), typed(&new), "{} vs {}", alias.var, s.var);
            let e = read(&[(s.var, "7")]).unwrap_err();
            assert_eq!(e.var, s.var);
            assert!(e.problem.contains("no unit"), "{}", e.problem);
            let both = read(&[(s.var, "7s"), (alias.var, "7")]).unwrap_err();
            assert!(both.problem.contains(alias.var), "{}", both.problem);
        }
    }
}

#[test]
fn defaults_are_the_parts_own_defaults() {
    let c = read(&[]).unwrap();
    assert_eq!(c.store.retention, crate::store::Retention::default());
    assert_eq!(
        c.store.replica_timeout,
        crate::store::redis::DEFAULT_REPLICA_TIMEOUT
    );
    assert_eq!(
        c.broker.retry_delays,
        crate::queue::Topology::new("x").retry_delays
    );
    assert_eq!(
        c.webhooks.send,
        crate::webhooks::send::SendSettings::default()
    );
    assert_eq!(c.limits.batch, BatchLimits::default());
    assert_eq!(c.rag.budget, crate::rag::RagBudget::default());
    assert_eq!(
        c.rag.chunk_lines,
        crate::rag::ChunkOptions::default().max_lines
    );
    assert_eq!(c.http.read_timeout, crate::net::READ_TIMEOUT);
    assert_eq!(
        c.model.calls.flex_fallback,
        Some(crate::contexts::FLEX_FALLBACK_AFTER)
    );
    assert!(c.model.streaming && !c.model.replay && c.http.console.is_none());
    assert_eq!(c.telemetry.log_format, crate::telemetry::LogFormat::Text);
    // Every setting is read, once, and every default parses.
    let read_settings: Vec<_> = c.effective().iter().map(|e| e.setting.var).collect();
    for s in ALL.iter().flat_map(|g| g.iter()) {
        let n = read_settings.iter().filter(|v| **v == s.var).count();
        assert_eq!(n, 1, "{} read {n} times", s.var);
    }
}

#[test]
fn names_and_keys_are_unique_and_keys_name_their_section() {
    let all: Vec<&Setting> = ALL.iter().flat_map(|g| g.iter()).copied().collect();
    let mut names: Vec<&str> = all.iter().map(|s| s.var).collect();
    names.extend(all.iter().flat_map(|s| s.aliases.iter().map(|a| a.var)));
    let mut keys: Vec<&str> = all.iter().map(|s| s.key).collect();
    let (n, k) = (names.len(), keys.len());
    names.sort_unstable();
    names.dedup();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(
        (names.len(), keys.len()),
        (n, k),
        "a name or key is declared twice"
    );
    for group in ALL.iter().skip(1) {
        let section = group[0].key.split_once('.').map(|(s, _)| s);
        assert!(section.is_some(), "{}", group[0].key);
        for s in group.iter() {
            assert_eq!(s.key.split_once('.').map(|(s, _)| s), section, "{}", s.key);
        }
    }
}

/// A configuration file of its own, removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn temp_file(text: &str) -> TempFile {
    let path = std::env::temp_dir().join(format!("aptix-config-{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(&path, text).unwrap();
    TempFile(path)
}

#[test]
fn the_file_sets_what_the_environment_does_not_and_each_origin_is_told() {
    let file = temp_file(
        "namespace = \"from-file\"\n\
         [model]\ntimeout = \"45s\"\nname = \"file-model\"\n\
         [broker]\nretry_delays = [\"1s\", \"2s\"]\nmax_attempts = 3\n\
         [http]\nconsole = true\n",
    );
    let path = file.path().to_string_lossy().into_owned();
    let c = read(&[("APTIX_CONFIG_FILE", &path), ("APTIX_MODEL", "env-model")]).unwrap();
    assert_eq!(c.namespace, "from-file");
    assert_eq!(c.model.timeout, Duration::from_secs(45));
    assert_eq!(
        c.model.name, "env-model",
        "the environment wins over the file"
    );
    assert_eq!(
        c.broker.retry_delays,
        [1, 2].map(Duration::from_secs).to_vec()
    );
    assert_eq!(c.broker.max_attempts, 3);
    assert_eq!(c.http.console, Some(true));
    let origin = |var: &str| {
        c.effective()
            .iter()
            .find(|e| e.setting.var == var)
            .map(|e| e.origin.clone())
    };
    assert_eq!(origin("APTIX_LLM_TIMEOUT"), Some(Origin::File));
    assert_eq!(origin("APTIX_MODEL"), Some(Origin::Env("APTIX_MODEL")));
    assert_eq!(origin("APTIX_LEASE"), Some(Origin::Default));
    let shown = reference::effective(&c);
    assert!(
        shown.contains("model.timeout") && shown.contains("45s  "),
        "{shown}"
    );
    assert!(
        shown.contains("(file)") && shown.contains("(env APTIX_MODEL)"),
        "{shown}"
    );
}

#[test]
fn a_bad_file_is_refused_naming_the_file_the_key_and_the_variable() {
    let unknown = temp_file("[model]\ntimout = \"5s\"\n");
    let path = unknown.path().to_string_lossy().into_owned();
    let e = read(&[("APTIX_CONFIG_FILE", &path)]).unwrap_err();
    assert_eq!(e.var, "APTIX_CONFIG_FILE");
    assert!(
        e.problem.contains("model.timout") && e.problem.contains("model.timeout"),
        "{}",
        e.problem
    );
    let unknown_section = temp_file("[modle]\ntimeout = \"5s\"\n");
    let path = unknown_section.path().to_string_lossy().into_owned();
    let e = read(&[("APTIX_CONFIG_FILE", &path)]).unwrap_err();
    assert!(
        e.problem.contains("modle.timeout") && e.problem.contains("broker, store, model"),
        "{}",
        e.problem
    );
    let bad_value = temp_file("[model]\ntimeout = \"soon\"\n");
    let path = bad_value.path().to_string_lossy().into_owned();
    let e = read(&[("APTIX_CONFIG_FILE", &path)]).unwrap_err();
    assert_eq!(e.var, "APTIX_LLM_TIMEOUT");
    assert!(e.problem.contains("key model.timeout"), "{}", e.problem);
    let not_toml = temp_file("[model\n");
    let path = not_toml.path().to_string_lossy().into_owned();
    let e = read(&[("APTIX_CONFIG_FILE", &path)]).unwrap_err();
    assert!(e.problem.contains("not TOML"), "{}", e.problem);
    let e = read(&[("APTIX_CONFIG_FILE", "/nonexistent/aptix.toml")]).unwrap_err();
    assert_eq!(e.var, "APTIX_CONFIG_FILE");
}

#[test]
fn the_effective_listing_masks_secrets_and_credentials() {
    let c = read(&[
        ("OPENAI_API_KEY", "sk-very-secret"),
        (
            "APTIX_AMQP_URL",
            "amqp://user:pa55@rabbit:5672/%2f,amqp://user:pa55@r2/",
        ),
        ("APTIX_API_TOKENS", "tok-secret=acme"),
        ("APTIX_REDIS_URL", "redis://redis:6379/"),
    ])
    .unwrap();
    let shown = reference::effective(&c);
    for secret in ["sk-very-secret", "pa55", "tok-secret", "user:"] {
        assert!(!shown.contains(secret), "{secret} shown in:\n{shown}");
    }
    assert!(
        shown.contains("amqp://****@rabbit:5672/%2f,amqp://****@r2/"),
        "{shown}"
    );
    assert!(shown.contains("redis://redis:6379/"), "{shown}");
    let concurrency = c.worker.concurrency.to_string();
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("worker.concurrency") && l.contains(&concurrency)),
        "the computed default is shown: {shown}"
    );
}

#[test]
fn durations_have_one_spelling() {
    for (text, d) in [
        ("500ms", Duration::from_millis(500)),
        ("30s", Duration::from_secs(30)),
        ("1.5s", Duration::from_millis(1500)),
        ("5m", Duration::from_secs(300)),
        ("2h", Duration::from_secs(7200)),
        ("7d", Duration::from_secs(7 * 86_400)),
    ] {
        assert_eq!(parse_duration(text, None), Ok(d), "{text}");
        assert_eq!(parse_duration(&format_duration(d), None), Ok(d), "{text}");
    }
    assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
    for bad in ["", "s", "5 minutes", "-1s", "1e9d"] {
        assert!(parse_duration(bad, None).is_err(), "{bad}");
    }
}

#[test]
fn the_reference_in_the_docs_is_the_generated_one() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let docs = std::fs::read_to_string(path).unwrap();
    let generated = reference::markdown();
    assert!(
        docs.contains(&generated),
        "docs/configuration.md is stale: replace its reference with `aptix config --reference`"
    );
    for s in ALL.iter().flat_map(|g| g.iter()) {
        if let Default::Value(v) = s.default {
            assert!(generated.contains(v), "{}", s.var);
        }
    }
}

#[test]
fn the_process_settings_refuse_only_what_the_command_uses() {
    let sources = |pairs: &'static [(&'static str, &'static str)]| {
        Sources::from_lookup(move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap()
    };
    // An unknown class stops the long-running commands only.
    let odd = sources(&[("APTIX_CPU_SCHEDULING", "fifo")]);
    assert_eq!(
        Process::read(&odd, true).unwrap_err().var,
        "APTIX_CPU_SCHEDULING"
    );
    assert!(Process::read(&odd, false).is_ok());
    // The CA bundle is read before the runtime only for span export.
    let ca = sources(&[("APTIX_TLS_CA_FILE", "/nonexistent/ca.pem")]);
    assert!(Process::read(&ca, false).unwrap().tls_ca.is_none());
    let exporting = sources(&[
        ("APTIX_TLS_CA_FILE", "/nonexistent/ca.pem"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
    ]);
    assert_eq!(
        Process::read(&exporting, false).unwrap_err().var,
        "APTIX_TLS_CA_FILE"
    );
    // A bad log format stops every command.
    let json5 = sources(&[("APTIX_LOG_FORMAT", "json5")]);
    assert_eq!(
        Process::read(&json5, false).unwrap_err().var,
        "APTIX_LOG_FORMAT"
    );
}

#[test]
fn the_example_file_in_the_docs_reads() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let docs = std::fs::read_to_string(path).unwrap();
    let example = docs
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/configuration.md shows an example file");
    let file = temp_file(example);
    let path = file.path().to_string_lossy().into_owned();
    let c = read(&[("APTIX_CONFIG_FILE", &path)]).unwrap();
    assert_eq!(c.model.timeout, Duration::from_secs(120));
    assert_eq!(c.store.min_replicas, 1);
    assert_eq!(c.http.console, Some(true));
    assert!(c.effective().iter().any(|e| e.origin == Origin::File));
}
