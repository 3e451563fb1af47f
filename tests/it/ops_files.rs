//! The Prometheus alert rules and the Grafana dashboard in `ops/`, held against the product:
//! every `aptix_*` series they name is one a running process exports on `/metrics` (a counter
//! as `<family>_total`, a histogram as its `_bucket`, `_sum` and `_count`, a gauge as itself),
//! and the dependency gauge the unreachable alerts read says what a probe finds — 1 with the
//! services answering, 0 while the store stalls. (`promtool check rules` and `promtool test
//! rules` check the rules' syntax and behaviour; `ops/grafana/check.py` the dashboard's
//! queries: `.ci/run` runs both.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use crate::app::{AppOptions, spawn};
use crate::support::StallProxy;

const OPS_FILES: [&str; 2] = [
    "ops/prometheus/aptix-alerts.yml",
    "ops/grafana/aptix-dashboard.json",
];

/// Every `aptix_…` name in `text`.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("aptix_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// The families of an exposition (`# TYPE <name> <type>`), by name.
fn families(exposition: &str) -> BTreeMap<String, String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.to_string()))
        .collect()
}

/// Whether `series` is a series of one of `families`.
fn exported(series: &str, families: &BTreeMap<String, String>) -> bool {
    let of = |family: &str, kinds: &[&str]| {
        families
            .get(family)
            .is_some_and(|kind| kinds.contains(&kind.as_str()))
    };
    of(series, &["gauge"])
        || series
            .strip_suffix("_total")
            .is_some_and(|f| of(f, &["counter"]))
        || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            series
                .strip_suffix(suffix)
                .is_some_and(|f| of(f, &["histogram"]))
        })
}

#[tokio::test]
async fn every_metric_the_alerts_and_the_dashboard_name_is_exported() {
    // A tenant with a quota and the default agent context: the series of both exist, at zero,
    // from the start.
    let tenants = std::env::temp_dir().join(format!(
        "aptix-tenants-{}.json",
        uuid::Uuid::new_v4().simple()
    ));
    let file = serde_json::json!({"tenants": [{"id": "tenant-a", "tokensPerDay": 1000, "maxRunningTurns": 4}]});
    std::fs::write(&tenants, file.to_string()).unwrap();
    // And an MCP tool source (a real server): its source, call and latency series exist
    // once it has listed its tools.
    let server = crate::mcp_support::HttpServer::start().await;
    let tools =
        crate::mcp_support::ToolsFile::new(vec![server.source("calc", serde_json::json!({}))]);
    let mut env = tools.env();
    env.push(("APTIX_TENANTS_FILE", tenants.display().to_string()));
    let app = spawn(AppOptions {
        extra_env: env,
        ..AppOptions::default()
    })
    .await;
    let exposition = app.metrics_text().await;
    let families = families(&exposition);
    assert!(families.len() > 20, "{exposition}");
    for file in OPS_FILES {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let named = names_in(&text);
        assert!(named.len() >= 8, "{file} names {named:?}");
        let missing: Vec<&String> = named.iter().filter(|n| !exported(n, &families)).collect();
        assert!(
            missing.is_empty(),
            "{file} names series no process exports: {missing:?}\nexported families: {:?}",
            families.keys().collect::<Vec<_>>()
        );
    }
}

/// The value of `aptix_dependency_up{dependency="<dependency>"}` in an exposition.
fn dependency_up(exposition: &str, dependency: &str) -> Option<u8> {
    let prefix = format!("aptix_dependency_up{{dependency=\"{dependency}\"}} ");
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn the_dependency_gauge_says_what_a_scrape_finds() {
    let target = crate::support::redis_url();
    let target = target
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_string();
    let proxy = StallProxy::start(&target).await;
    let app = spawn(AppOptions {
        redis_url: Some(format!("redis://{}/", proxy.addr)),
        dependency_timeout: Some(Duration::from_millis(500)),
        ..AppOptions::default()
    })
    .await;
    let up = app.metrics_text().await;
    assert_eq!(dependency_up(&up, "store"), Some(1), "{up}");
    assert_eq!(dependency_up(&up, "broker"), Some(1), "{up}");
    proxy.stall(true);
    let stalled = app.metrics_text().await;
    assert_eq!(dependency_up(&stalled, "store"), Some(0), "{stalled}");
    assert_eq!(dependency_up(&stalled, "broker"), Some(1), "{stalled}");
    proxy.stall(false);
    // The stalled probe's connection may need a moment to be usable again.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let again = app.metrics_text().await;
        if dependency_up(&again, "store") == Some(1) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{again}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
