//! `docker-compose.yml` and `ops/Containerfile`, checked for shape (there is no Docker engine
//! here): the services a deployment needs, health checks that use commands the image has, the
//! files they mount, settings the product knows, and workers that can be scaled.

use std::collections::BTreeMap;
use std::path::Path;

use yaml_rust2::{Yaml, YamlLoader};

/// The document, with `<<` merge keys resolved as Compose resolves them.
fn compose() -> Yaml {
    compose_file("docker-compose.yml")
}

/// A Compose file of the repository, merge keys resolved.
fn compose_file(path: &str) -> Yaml {
    let text = repo_file(path);
    let docs = YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{path} is YAML: {e}"));
    merged(&docs[0])
}

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Whether the README or a page of `docs/` documents a setting (`APTIX_…` in their tables).
fn documented(var: &str) -> bool {
    let mut pages = vec![repo_file("README.md")];
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    for entry in std::fs::read_dir(&docs).unwrap_or_else(|e| panic!("docs/: {e}")) {
        let path = entry.expect("a docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(std::fs::read_to_string(&path).expect("a docs page"));
        }
    }
    pages.iter().any(|p| p.contains(&format!("`{var}`")))
}

/// `ops/compose.cluster.yml`: three RabbitMQ nodes of one cluster that every process is
/// given, a Redis primary and replica with a Sentinel majority and a balancer that follows the
/// primary, two front doors behind a balancer that checks their readiness, and scalable
/// workers; every file it mounts exists and every setting it sets is documented.
#[test]
fn the_cluster_compose_file_has_every_part_of_a_deployment_beyond_one_machine() {
    let doc = compose_file("ops/compose.cluster.yml");
    let services = &doc["services"];
    let nodes = ["rabbitmq1", "rabbitmq2", "rabbitmq3"];
    let mut cookies = Vec::new();
    for node in nodes {
        let s = &services[node];
        assert_eq!(
            s["hostname"].as_str(),
            Some(node),
            "node names follow hostnames"
        );
        cookies.push(
            s["environment"]["RABBITMQ_ERLANG_COOKIE"]
                .as_str()
                .map(String::from),
        );
    }
    assert!(
        cookies.iter().all(|c| c.is_some() && *c == cookies[0]),
        "one cookie"
    );
    let rabbit_conf = repo_file("ops/cluster/rabbitmq.conf");
    for node in nodes {
        assert!(
            rabbit_conf.contains(&format!("= rabbit@{node}")),
            "{node} is a peer"
        );
    }
    for name in ["api1", "api2", "worker"] {
        let env = &services[name]["environment"];
        let amqp = env["APTIX_AMQP_URL"].as_str().unwrap();
        let urls: Vec<&str> = amqp.split(',').collect();
        assert_eq!(urls.len(), 3, "{name}: every node: {amqp}");
        for node in nodes {
            assert!(amqp.contains(&format!("@{node}:5672")), "{name}: {node}");
        }
        assert_eq!(
            env["APTIX_REDIS_URL"].as_str(),
            Some("redis://redis-lb:6379/")
        );
        assert_eq!(env["APTIX_REDIS_MIN_REPLICAS"].as_str(), Some("1"));
        for (k, _) in env.as_hash().unwrap() {
            let k = k.as_str().unwrap();
            assert!(
                documented(k),
                "{name} sets {k}, which the README does not document"
            );
        }
        assert_eq!(
            services[name]["build"]["dockerfile"].as_str(),
            Some("ops/Containerfile")
        );
    }
    // Redis: a replica of the primary, Sentinels that agree by majority, a balancer that
    // passes only the primary and cuts the clients of a demoted one.
    assert!(
        strings(&services["redis-b"]["command"])
            .windows(3)
            .any(|w| w == ["--replicaof", "redis-a", "6379"])
    );
    let sentinels = ["sentinel1", "sentinel2", "sentinel3"];
    assert!(sentinels.iter().all(|s| !services[*s].is_badvalue()));
    let sentinel_conf = repo_file("ops/cluster/sentinel.conf");
    assert!(
        sentinel_conf
            .lines()
            .any(|l| l.trim() == "sentinel monitor aptix redis-a 6379 2")
    );
    let redis_lb = repo_file("ops/cluster/haproxy-redis.cfg");
    for needle in [
        "expect string role:master",
        "on-marked-down shutdown-sessions",
        "redis-a:6379",
        "redis-b:6379",
    ] {
        assert!(redis_lb.contains(needle), "haproxy-redis.cfg: {needle}");
    }
    // Two front doors behind a balancer that asks each for /readyz.
    let api_lb = repo_file("ops/cluster/haproxy-api.cfg");
    for needle in [
        "option httpchk GET /readyz",
        "server api1 api1:8080",
        "server api2 api2:8080",
        "balance roundrobin",
    ] {
        assert!(api_lb.contains(needle), "haproxy-api.cfg: {needle}");
    }
    assert_eq!(strings(&services["api-lb"]["ports"]), ["8080:8080"]);
    // Workers scale and drain.
    assert!(
        services["worker"]["deploy"]["replicas"]
            .as_i64()
            .unwrap_or(0)
            >= 2
    );
    assert!(services["worker"]["ports"].is_badvalue());
    assert!(services["worker"]["stop_grace_period"].as_str().is_some());
    // Every file mounted exists (paths are relative to ops/).
    let services = services.as_hash().unwrap();
    let mut mounted = 0;
    for (_, s) in services {
        for v in strings(&s["volumes"]) {
            if let Some(path) = v.strip_prefix("./").and_then(|p| p.split(':').next()) {
                assert!(
                    Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("ops")
                        .join(path)
                        .is_file(),
                    "ops/{path} is mounted but missing"
                );
                mounted += 1;
            }
        }
    }
    assert!(mounted >= 10, "{mounted} files mounted");
}

fn merged(y: &Yaml) -> Yaml {
    match y {
        Yaml::Hash(h) => {
            let mut out = yaml_rust2::yaml::Hash::new();
            if let Some(base) = h.get(&Yaml::String("<<".into()))
                && let Yaml::Hash(b) = merged(base)
            {
                out.extend(b);
            }
            for (k, v) in h {
                if k.as_str() != Some("<<") {
                    out.insert(k.clone(), merged(v));
                }
            }
            Yaml::Hash(out)
        }
        Yaml::Array(a) => Yaml::Array(a.iter().map(merged).collect()),
        other => other.clone(),
    }
}

fn strings(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .map(|v| {
            v.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn compose_runs_the_whole_system_with_health_checks_and_scalable_workers() {
    let doc = compose();
    let services = &doc["services"];
    for name in ["rabbitmq", "redis", "api", "worker"] {
        assert!(!services[name].is_badvalue(), "no {name} service");
        let check = strings(&services[name]["healthcheck"]["test"]);
        assert!(
            check.first().is_some_and(|c| c == "CMD"),
            "{name} has no health check"
        );
    }
    // The product's services are built from the Containerfile and wait for healthy services.
    for name in ["api", "worker"] {
        let s = &services[name];
        assert_eq!(s["build"]["dockerfile"].as_str(), Some("ops/Containerfile"));
        for dep in ["rabbitmq", "redis"] {
            assert_eq!(
                s["depends_on"][dep]["condition"].as_str(),
                Some("service_healthy"),
                "{name}"
            );
        }
        // Their health checks run `aptix probe` against their own /readyz.
        let check = strings(&s["healthcheck"]["test"]);
        assert_eq!(&check[1..3], ["aptix", "probe"], "{name}: {check:?}");
        assert!(check[3].ends_with("/readyz"));
        let env = s["environment"].as_hash().unwrap();
        for (k, _) in env {
            let k = k.as_str().unwrap();
            assert!(
                documented(k),
                "{name} sets {k}, which the README does not document"
            );
        }
        assert!(env.contains_key(&Yaml::String("APTIX_AMQP_URL".into())));
        assert!(env.contains_key(&Yaml::String("APTIX_REDIS_URL".into())));
    }
    // `--scale worker=N` needs a worker without a fixed name or published port.
    assert!(services["worker"]["ports"].is_badvalue());
    assert!(services["worker"]["container_name"].is_badvalue());
    assert!(
        services["worker"]["stop_grace_period"].as_str().is_some(),
        "workers drain on stop"
    );
    // Redis keeps an append-only file; the files mounted exist.
    let redis_conf =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ops/redis.conf"))
            .unwrap();
    assert!(redis_conf.lines().any(|l| l.trim() == "appendonly yes"));
    let mut mounted = BTreeMap::new();
    for name in ["rabbitmq", "redis"] {
        for v in strings(&services[name]["volumes"]) {
            if let Some(path) = v.strip_prefix("./").and_then(|p| p.split(':').next()) {
                mounted.insert(path.to_string(), name);
            }
        }
    }
    assert_eq!(mounted.len(), 2, "{mounted:?}");
    for path in mounted.keys() {
        assert!(
            Path::new(env!("CARGO_MANIFEST_DIR")).join(path).is_file(),
            "{path}"
        );
    }
}

#[test]
fn every_command_compose_runs_is_a_command_of_the_binary() {
    let doc = compose();
    let services = doc["services"].as_hash().unwrap();
    let mut commands = Vec::new();
    for (name, s) in services {
        if !s["build"].is_badvalue() {
            let command = strings(&s["command"]);
            commands.push((name.as_str().unwrap().to_string(), command[0].clone()));
        }
        let check = strings(&s["healthcheck"]["test"]);
        if check.get(1).is_some_and(|c| c == "aptix") {
            commands.push((
                format!("{} health check", name.as_str().unwrap()),
                check[2].clone(),
            ));
        }
    }
    assert!(commands.len() >= 5, "{commands:?}");
    for (who, command) in commands {
        let out = crate::cli::aptix()
            .args([&command, "--help"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{who} runs `aptix {command}`, which does not exist"
        );
    }
}

#[test]
fn the_containerfile_copies_what_exists_and_builds_the_binary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("ops/Containerfile")).unwrap();
    for line in text
        .lines()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let parts: Vec<&str> = line.split_whitespace().collect();
        for src in &parts[1..parts.len() - 1] {
            assert!(
                root.join(src).exists(),
                "the Containerfile copies {src}, which does not exist"
            );
        }
    }
    assert!(text.contains("--bin aptix"));
    assert!(text.contains("ENTRYPOINT [\"/usr/local/bin/aptix\"]"));
}

#[tokio::test]
async fn aptix_probe_succeeds_on_a_ready_service_only() {
    let app = crate::app::spawn(crate::app::AppOptions {
        backend: crate::app::Backend::Embedded,
        ..crate::app::AppOptions::default()
    })
    .await;
    let ready = format!("{}/readyz", app.base);
    let ok = tokio::task::spawn_blocking(move || {
        crate::cli::aptix()
            .args(["probe", &ready])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let missing = format!("{}/no-such-route", app.base);
    let down = tokio::task::spawn_blocking(move || {
        let a = crate::cli::aptix()
            .args(["probe", &missing])
            .output()
            .unwrap();
        let b = crate::cli::aptix()
            .args(["probe", "http://127.0.0.1:1/readyz"])
            .output()
            .unwrap();
        (a, b)
    })
    .await
    .unwrap();
    assert!(!down.0.status.success());
    assert!(String::from_utf8_lossy(&down.0.stderr).contains("404"));
    assert!(!down.1.status.success());
    assert!(String::from_utf8_lossy(&down.1.stderr).contains("cannot be reached"));
}
