//! The configuration file and `aptix config`, driven through the binary as an operator would:
//! a file under the environment, what `aptix config` says about both, a file that changes what
//! the product does, and files that are refused.

use crate::support::aptix;

/// A configuration file of the test's own, removed when the guard drops.
struct Removed(std::path::PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn file(text: &str) -> (Removed, String) {
    let path = std::env::temp_dir().join(format!("aptix-{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, text).expect("writes");
    let shown = path.to_string_lossy().into_owned();
    (Removed(path), shown)
}

#[test]
fn aptix_config_tells_each_value_and_where_it_came_from_with_secrets_masked() {
    let (_dir, path) = file(
        "[broker]\nurl = \"amqp://aptix:file-secret@rabbit:5672/%2f\"\n\
         [model]\ntimeout = \"45s\"\nname = \"from-file\"\n",
    );
    let out = aptix()
        .arg("config")
        .env("APTIX_CONFIG_FILE", &path)
        .env("APTIX_MODEL", "from-env")
        .env("APTIX_LEASE_SECS", "9")
        .env("OPENAI_API_KEY", "sk-env-secret")
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |key: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(key))
            .unwrap_or_else(|| panic!("no {key} in:\n{stdout}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(stdout.starts_with(&format!("# file: {path}")), "{stdout}");
    assert_eq!(line("model.timeout"), "model.timeout 45s (file)");
    assert_eq!(line("model.name"), "model.name from-env (env APTIX_MODEL)");
    assert_eq!(line("store.lease"), "store.lease 9s (env APTIX_LEASE_SECS)");
    assert_eq!(
        line("model.api_key"),
        "model.api_key **** (env OPENAI_API_KEY)"
    );
    assert_eq!(
        line("broker.url"),
        "broker.url amqp://****@rabbit:5672/%2f (file)"
    );
    assert_eq!(
        line("worker.max_iterations"),
        "worker.max_iterations 8 (default)"
    );
    for secret in ["file-secret", "sk-env-secret"] {
        assert!(!stdout.contains(secret), "{secret} printed:\n{stdout}");
    }
}

#[test]
fn a_limit_set_in_the_file_is_the_limit_the_product_applies() {
    let (_dir, path) = file("[limits]\nmax_instruction_bytes = 10\n");
    let run = |config: Option<&str>| {
        let mut c = aptix();
        c.args(["validate", "examples/requests/user-turn.json"]);
        if let Some(path) = config {
            c.env("APTIX_CONFIG_FILE", path);
        }
        c.output().expect("runs")
    };
    let plain = run(None);
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stdout)
    );
    let limited = run(Some(&path));
    let stdout = String::from_utf8_lossy(&limited.stdout);
    assert_eq!(limited.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("10"), "the file's limit is named: {stdout}");
}

#[test]
fn a_bad_file_stops_every_command_naming_the_file_and_the_key() {
    // A file that cannot be read as a whole stops the binary before any command (exit 2, as a
    // bad APTIX_LOG_FORMAT does); a value that does not parse stops the command that reads it
    // (exit 1, as a bad variable always has).
    for (text, expect, code) in [
        ("[model]\ntimout = \"5s\"\n", "model.timout", 2),
        ("[model\n", "not TOML", 2),
        ("[model]\ntimeout = \"soon\"\n", "key model.timeout", 1),
    ] {
        let (_dir, path) = file(text);
        let out = aptix()
            .arg("config")
            .env("APTIX_CONFIG_FILE", &path)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{text}: {stderr}");
        assert!(stderr.contains(expect), "{text}: {stderr}");
    }
    let out = aptix()
        .arg("config")
        .env("APTIX_CONFIG_FILE", "/nonexistent/aptix.toml")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("APTIX_CONFIG_FILE"));
}

#[test]
fn the_reference_command_prints_every_variable_and_key() {
    let out = aptix()
        .args(["config", "--reference"])
        .output()
        .expect("runs");
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    for name in [
        "`APTIX_LLM_TIMEOUT`<br>or `APTIX_LLM_TIMEOUT_SECS` (seconds)",
        "`model.timeout`",
        "`APTIX_WEBHOOK_GIVE_UP_SECS`",
        "### `[telemetry]`",
    ] {
        assert!(stdout.contains(name), "{name} missing");
    }
}
