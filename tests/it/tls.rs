//! TLS to RabbitMQ and Redis, tested for real: stunnel (from Debian's packages; `.ci/run`
//! installs it) terminates TLS in front of the local RabbitMQ and Redis with a certificate
//! signed by a CA this test generates with `openssl`. A turn runs end to end over both with
//! `APTIX_TLS_CA_FILE`; without it the process stops at once, saying the certificate is not
//! trusted, instead of hanging.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{free_port, wait_for_port};

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh directory holding a CA (`ca.pem`) and a certificate for 127.0.0.1 and localhost
/// signed by it (`server.pem`, its key `server.key`), made with `openssl`.
pub(crate) fn certificates() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aptix-tls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let openssl = |args: &[&str]| {
        run(Command::new("openssl").args(args).current_dir(&dir));
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=aptix test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
    dir
}

/// A CA, a server certificate for 127.0.0.1 signed by it, and stunnel terminating TLS with it
/// in front of RabbitMQ (`amqp_port`) and Redis (`redis_port`).
struct TlsFront {
    dir: PathBuf,
    amqp_port: u16,
    redis_port: u16,
    /// TLS in front of the model server, when one was given.
    https_port: u16,
    stunnel: Child,
}

impl TlsFront {
    fn start() -> Self {
        Self::start_with_model(None)
    }

    /// Also terminates TLS in front of a model server listening on `model_port`.
    fn start_with_model(model_port: Option<u16>) -> Self {
        let dir = certificates();
        let (amqp_port, redis_port, https_port) = (free_port(), free_port(), free_port());
        let service = |name: &str, accept: u16, connect: u16| {
            format!(
                "[{name}]\naccept = 127.0.0.1:{accept}\nconnect = 127.0.0.1:{connect}\ncert = {d}/server.pem\nkey = {d}/server.key\n\n",
                d = dir.display()
            )
        };
        let mut conf = String::from("foreground = yes\npid =\n\n");
        conf.push_str(&service("amqps", amqp_port, 5672));
        conf.push_str(&service("rediss", redis_port, 6379));
        if let Some(model) = model_port {
            conf.push_str(&service("https", https_port, model));
        }
        std::fs::write(dir.join("stunnel.conf"), conf).unwrap();
        let stunnel = Command::new("stunnel")
            .arg(dir.join("stunnel.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("stunnel must be installed for the TLS tests (.ci/run installs it)");
        wait_for_port(amqp_port);
        wait_for_port(redis_port);
        if model_port.is_some() {
            wait_for_port(https_port);
        }
        Self {
            dir,
            amqp_port,
            redis_port,
            https_port,
            stunnel,
        }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    fn amqps(&self) -> String {
        format!("amqps://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }

    fn rediss(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.redis_port)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        let _ = self.stunnel.kill();
        let _ = self.stunnel.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn aptix(namespace: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_aptix"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    for var in [
        "APTIX_LLM_BASE_URL",
        "OPENAI_API_KEY",
        "APTIX_AMQP_URL",
        "APTIX_REDIS_URL",
        "APTIX_TLS_CA_FILE",
    ] {
        c.env_remove(var);
    }
    c.env("APTIX_NAMESPACE", namespace);
    c
}

/// Kills a child process when dropped.
/// Waits for a process to exit by itself within `limit`; its exit status and stderr.
fn exits_within(mut child: Child, limit: Duration) -> (std::process::ExitStatus, String) {
    use std::io::Read as _;
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut stderr);
            }
            return (status, stderr);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the process did not stop within {limit:?}: a TLS problem must not hang it");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Removes what the run left under its namespace in RabbitMQ and Redis.
async fn clean_up(namespace: &str) {
    let mut topology = aptix_worker::queue::Topology::new(namespace);
    topology.reply_queue_ttl = Duration::from_secs(30);
    let broker = aptix_worker::queue::RabbitBroker::new(
        &crate::support::amqp_url(),
        topology,
        "aptix-test-cleanup",
    );
    let _ = broker.delete_topology().await;
    if let Ok(store) = aptix_worker::store::RedisStore::connect(
        &crate::support::redis_url(),
        namespace,
        Default::default(),
    )
    .await
    {
        let _ = store.delete_namespace().await;
    }
}

#[tokio::test]
async fn a_turn_runs_end_to_end_over_tls_to_rabbitmq_redis_and_the_model() {
    a_turn_over_tls("http1").await;
}

/// By default the server chooses by ALPN; stunnel chooses nothing, which leaves HTTP/1.1.
#[tokio::test]
async fn a_model_call_goes_as_http1_inside_tls_by_default_when_the_server_offers_no_choice() {
    a_turn_over_tls("auto").await;
}

/// HTTP/2 inside TLS: the client asks for `h2` by ALPN (stunnel passes the bytes on to the
/// fake model, which takes HTTP/2 by prior knowledge).
#[tokio::test]
async fn a_model_call_goes_as_http2_inside_tls_when_asked() {
    a_turn_over_tls("http2").await;
}

/// A turn over TLS to RabbitMQ, Redis and the model, the model's calls over `version`
/// (`APTIX_LLM_HTTP`).
async fn a_turn_over_tls(version: &str) {
    use aptix_worker::fake_llm::{FakeLlm, FakeOptions, Reply};
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        FakeOptions::default(),
        Some(crate::support::schema()),
    )
    .await
    .unwrap();
    fake.push([Reply::Text("answered over TLS".into())]);
    let model_port: u16 = fake
        .base_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .and_then(|p| p.parse().ok())
        .expect("the fake's port");
    let front = TlsFront::start_with_model(Some(model_port));
    let namespace = format!("aptix-test-{}", uuid::Uuid::new_v4().simple());
    let server = crate::support::Listening::start(
        aptix(&namespace)
            .args(["run", "--listen", "127.0.0.1:0"])
            .env("APTIX_AMQP_URL", front.amqps())
            .env("APTIX_REDIS_URL", front.rediss())
            .env("APTIX_TLS_CA_FILE", front.ca())
            .env(
                "APTIX_LLM_BASE_URL",
                fake.base_url().replace(
                    &format!("http://127.0.0.1:{model_port}"),
                    &format!("https://127.0.0.1:{}", front.https_port),
                ),
            )
            .env("APTIX_LLM_HTTP", version)
            .env("APTIX_REPLY_QUEUE_TTL_SECS", "30"),
    );
    let port = server.port;
    let http = crate::support::http_client();
    let ready = http
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        ready.status().as_u16(),
        200,
        "{}",
        ready.text().await.unwrap()
    );
    let answer: Value = http
        .post(format!("http://127.0.0.1:{port}/api/ai/agent/execute"))
        .body(r#"{"sessionId": "tls-s", "turnId": "tls-t", "instruction": "over TLS"}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["successful"], true, "{answer}");
    assert_eq!(answer["result"]["primaryOutputText"], "answered over TLS");
    assert_eq!(fake.requests().len(), 1, "the model was reached over TLS");
    assert_eq!(
        fake.http2_requests(),
        u64::from(version == "http2"),
        "the call went over {version}"
    );
    drop(server);
    // What went over TLS is really in RabbitMQ and Redis: the turn record, read directly.
    let store = aptix_worker::store::RedisStore::connect(
        &crate::support::redis_url(),
        &namespace,
        Default::default(),
    )
    .await
    .unwrap();
    use aptix_worker::store::StoreReader as _;
    let record = store
        .get_turn(
            &aptix_worker::contract::SessionId::parse("tls-s").unwrap(),
            &aptix_worker::contract::TurnId::parse("tls-t").unwrap(),
        )
        .await
        .unwrap()
        .expect("the turn is stored in Redis");
    assert_eq!(record.status, aptix_worker::store::TurnStatus::Completed);
    clean_up(&namespace).await;
}

#[tokio::test]
async fn an_untrusted_certificate_stops_the_process_with_a_clear_message() {
    let front = TlsFront::start();
    let namespace = format!("aptix-test-{}", uuid::Uuid::new_v4().simple());
    // RabbitMQ over TLS without the CA: the broker's certificate is not trusted.
    let child = aptix(&namespace)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("APTIX_AMQP_URL", front.amqps())
        .env("APTIX_REDIS_URL", crate::support::redis_url())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, stderr) = exits_within(child, Duration::from_secs(20));
    assert!(!status.success(), "{stderr}");
    assert!(stderr.to_lowercase().contains("certificate"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Redis over TLS without the CA.
    let child = aptix(&namespace)
        .args(["run", "--listen", "127.0.0.1:0"])
        .env("APTIX_REDIS_URL", front.rediss())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, stderr) = exits_within(child, Duration::from_secs(30));
    assert!(!status.success(), "{stderr}");
    assert!(stderr.to_lowercase().contains("certificate"), "{stderr}");
    // A CA file that is not a certificate bundle is refused before anything connects.
    let bogus = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let child = aptix(&namespace)
        .args(["run", "--listen", "127.0.0.1:0"])
        .env("APTIX_TLS_CA_FILE", &bogus)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, stderr) = exits_within(child, Duration::from_secs(10));
    assert!(!status.success());
    assert!(stderr.contains("APTIX_TLS_CA_FILE"), "{stderr}");
    clean_up(&namespace).await;
}
