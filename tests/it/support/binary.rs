//! The `aptix` binary as the tests run it: a process serving on a port it chose (its log read
//! for the port), the binary without the environment's configuration, ports, `rabbitmqctl`,
//! and an HTTP client.

use std::time::Duration;

/// An HTTP client for tests, with the process's crypto provider installed first (the product
/// installs it at start-up; reqwest needs one to build a client).
pub fn http_client() -> reqwest::Client {
    aptix_worker::tls::install_crypto_provider();
    reqwest::Client::new()
}

/// An `aptix` process serving on a port the system chose (`--listen 127.0.0.1:0`), so no port
/// is picked in advance and raced for. Its stderr is read in the background: the port comes
/// from the log line that reports the bound address (text or JSON logs), and every line stays
/// readable. Dropping it kills the process.
pub struct Listening {
    pub child: std::process::Child,
    pub port: u16,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// The port in the log line that reports what the process listens on (`HTTP API listening`,
/// `serving /healthz…`, `fake Responses API listening`): `address=127.0.0.1:P`,
/// `"address":"127.0.0.1:P"` or the fake model's `base_url=http://127.0.0.1:P/v1`. Other lines
/// that name an address (the built-in fake model an `aptix run` starts) do not count.
fn bound_port(line: &str) -> Option<u16> {
    if !(line.contains("listening") || line.contains("serving")) {
        return None;
    }
    [
        "address=",
        "\"address\":\"",
        "base_url=http://",
        "\"base_url\":\"http://",
    ]
    .iter()
    .find_map(|key| {
        let rest = &line[line.find(key)? + key.len()..];
        let after_host = rest.strip_prefix("127.0.0.1:")?;
        let digits: String = after_host
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    })
}

impl Listening {
    /// Starts `cmd` (whose arguments include `--listen 127.0.0.1:0`) and waits up to 20 s for
    /// the address it bound.
    pub fn start(cmd: &mut std::process::Command) -> Self {
        Self::start_within(cmd, Duration::from_secs(20))
    }

    /// [`Listening::start`], waiting up to `deadline` for the address (a process in a class
    /// that gets the CPU last needs longer on a busy machine).
    pub fn start_within(cmd: &mut std::process::Command, deadline: Duration) -> Self {
        use std::io::BufRead as _;
        let mut child = cmd
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the process starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let seen = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(port) = bound_port(&line) {
                    let _ = tx.send(port);
                }
                seen.lock().unwrap().push(line);
            }
        });
        let port = rx.recv_timeout(deadline).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!(
                "the process reported no address within {deadline:?}: {:?}",
                lines.lock().unwrap()
            )
        });
        Self {
            child,
            port,
            lines,
            reader: Some(reader),
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Whether a line containing `needle` is logged within `timeout`.
    pub fn wait_for_line(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self
                .lines
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(needle))
            {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The stderr lines read so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Every stderr line, once the process has exited and its stderr is closed.
    pub fn lines_after_exit(&mut self) -> Vec<String> {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on right now, for a program that must be told its port (stunnel).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (up to 20 s) until something accepts connections on the port.
pub fn wait_for_port(port: u16) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing listens on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The binary, without any configuration variables of the environment the tests run in.
pub fn aptix() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_aptix"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    for var in [
        "APTIX_LLM_BASE_URL",
        "OPENAI_API_KEY",
        "APTIX_AMQP_URL",
        "APTIX_REDIS_URL",
        "APTIX_MODES_FILE",
        "APTIX_CONTEXTS_FILE",
        "APTIX_CONFIG_FILE",
    ] {
        c.env_remove(var);
    }
    c
}

/// Runs `rabbitmqctl` with `args`; its output, or a panic saying why it failed.
pub fn rabbitmqctl(args: &[&str]) -> String {
    let out = std::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl runs");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
