//! A real MCP server for the tests: `tests/mcp/server.py`, written with the official Python
//! SDK (PyPI `mcp`, which `.ci/run` installs into a cached virtualenv), started on 127.0.0.1
//! over Streamable HTTP or named in a tools file as a stdio command. What it ran is read from
//! its state directory, from outside.
//!
//! The SDK's interpreter is `$APTIX_MCP_PYTHON` or where `.ci/run` installs it; a machine
//! without it fails these tests, naming what to install.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The `mcp` version `.ci/run` installs.
pub const MCP_VERSION: &str = "2.3.0";

/// The Python interpreter that has the SDK.
pub fn python() -> PathBuf {
    if let Ok(path) = std::env::var("APTIX_MCP_PYTHON") {
        return PathBuf::from(path);
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let path = PathBuf::from(home).join(format!(".cache/aptix-ci/mcp-{MCP_VERSION}/bin/python"));
    assert!(
        path.exists(),
        "{} is missing: install the MCP SDK with `python3 -m venv {dir} && {dir}/bin/pip install mcp=={MCP_VERSION} uvicorn` (.ci/run does), or set APTIX_MCP_PYTHON",
        path.display(),
        dir = path
            .parent()
            .and_then(|p| p.parent())
            .unwrap_or(&path)
            .display(),
    );
    path
}

/// The server script.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/server.py")
}

/// A free port on 127.0.0.1.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("its address").port()
}

/// The state directory the server writes what it ran to (removed when dropped).
pub struct State {
    pub dir: PathBuf,
}

impl State {
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("aptix-mcp-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir }
    }

    /// Every call the server ran, in order.
    pub fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The calls of `tool`.
    pub fn calls_of(&self, tool: &str) -> Vec<Value> {
        self.calls()
            .into_iter()
            .filter(|c| c["tool"] == tool)
            .collect()
    }

    /// Waits (up to 20 s) until a call of `tool` with `delay_ms` has started, and takes its
    /// marker away (the next call makes a new one).
    pub async fn wait_started(&self, tool: &str) {
        let marker = self.dir.join(format!("started-{tool}"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !marker.exists() {
            assert!(Instant::now() < deadline, "{tool} was never called");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = std::fs::remove_file(marker);
    }

    /// A tools-file source running the server over stdio.
    pub fn stdio_source(&self, name: &str, extra: Value) -> Value {
        let mut s = json!({
            "name": name,
            "command": python(),
            "args": [script(), "stdio", self.dir],
        });
        merge(&mut s, extra);
        s
    }
}

impl Drop for State {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server over Streamable HTTP on its own port, stopped when dropped.
pub struct HttpServer {
    pub port: u16,
    pub state: State,
    child: Option<Child>,
}

impl HttpServer {
    /// Starts it on a free port and waits until it answers.
    pub async fn start() -> Self {
        let mut s = Self {
            port: free_port(),
            state: State::new(),
            child: None,
        };
        s.restart().await;
        s
    }

    /// Starts it on `port`, writing to `state`.
    pub async fn at(port: u16, state: State) -> Self {
        let mut s = Self {
            port,
            state,
            child: None,
        };
        s.restart().await;
        s
    }

    /// Its MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// A tools-file source for it.
    pub fn source(&self, name: &str, extra: Value) -> Value {
        let mut s = json!({"name": name, "url": self.url()});
        merge(&mut s, extra);
        s
    }

    /// Kills it (as a crash would).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it (again) on the same port and waits until it listens.
    pub async fn restart(&mut self) {
        self.kill();
        let child = Command::new(python())
            .arg(script())
            .args(["http", &self.port.to_string()])
            .arg(&self.state.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the MCP server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "the MCP server did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn merge(into: &mut Value, extra: Value) {
    if let (Some(into), Value::Object(extra)) = (into.as_object_mut(), extra) {
        into.extend(extra);
    }
}

/// Writes a tools file with `sources`; the path, removed when the returned guard goes.
pub struct ToolsFile {
    pub path: PathBuf,
}

impl ToolsFile {
    pub fn new(sources: Vec<Value>) -> Self {
        let path = std::env::temp_dir().join(format!(
            "aptix-tools-{}.json",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::write(&path, json!({ "sources": sources }).to_string()).unwrap();
        Self { path }
    }

    /// The settings that point a process at it, with loopback over `http` allowed.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("APTIX_TOOLS_FILE", self.path.display().to_string()),
            ("APTIX_TOOLS_ALLOW", "127.0.0.1".into()),
            ("APTIX_TOOLS_ALLOW_HTTP", "true".into()),
        ]
    }
}

impl Drop for ToolsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The `function_call_output` items of a model request, as `(call_id, output)`.
pub fn tool_outputs(request: &Value) -> Vec<(String, String)> {
    request["input"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|i| i["type"] == "function_call_output")
                .map(|i| {
                    (
                        i["call_id"].as_str().unwrap_or_default().to_string(),
                        i["output"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The names of the function tools a model request offers.
pub fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The idempotency key the README documents for call `call_id` of turn `turn` of session
/// `session` (within its tenant), computed here, not by the product's code.
pub fn idempotency_key(session: &str, turn: &str, call_id: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("{session}/{turn}/{call_id}").as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}
