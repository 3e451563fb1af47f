//! The model client's default over TLS (`model.http = auto`), seen from the server's side. A
//! TLS front of this test's (rustls, offering the ALPN protocols it is given) passes each
//! connection on to the fake model, which takes HTTP/1.1 and HTTP/2 alike, and notes what each
//! handshake chose. A server that offers HTTP/2 gets the calls as streams sharing a connection;
//! one that offers HTTP/1.1 alone gets a connection per call in flight, and every call
//! completes either way. (A server that chooses nothing — stunnel — is `tls.rs`'s.)

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aptix_worker::fake_llm::FakeOptions;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::sync::watch;

use crate::app::{App, AppOptions, Backend, spawn};

/// Calls made at once, each waiting on the model while the others start.
const AT_ONCE: usize = 8;

/// TLS terminated in front of the fake model with a certificate the client is told to trust.
struct AlpnFront {
    port: u16,
    dir: PathBuf,
    /// The fake's port, once it is known (connections wait for it).
    upstream: watch::Sender<Option<u16>>,
    /// What ALPN chose on each connection, in the order the handshakes ended.
    chosen: Arc<Mutex<Vec<Option<String>>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl AlpnFront {
    async fn start(protocols: &[&str]) -> Self {
        let dir = crate::tls::certificates();
        let certs = CertificateDer::pem_file_iter(dir.join("server.pem"))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        config.alpn_protocols = protocols.iter().map(|p| p.as_bytes().to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (upstream, target) = watch::channel(None);
        let chosen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let noted = Arc::clone(&chosen);
        let accepting = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (acceptor, mut target, noted) =
                    (acceptor.clone(), target.clone(), Arc::clone(&noted));
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(socket).await else {
                        return;
                    };
                    let alpn = tls.get_ref().1.alpn_protocol();
                    let alpn = alpn.map(|p| String::from_utf8_lossy(p).into_owned());
                    noted.lock().unwrap().push(alpn);
                    let Some(port) = target.wait_for(Option::is_some).await.ok().and_then(|p| *p)
                    else {
                        return;
                    };
                    let Ok(mut model) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                    else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut model).await;
                });
            }
        });
        Self {
            port,
            dir,
            upstream,
            chosen,
            accepting,
        }
    }

    fn chosen(&self) -> Vec<Option<String>> {
        self.chosen.lock().unwrap().clone()
    }
}

impl Drop for AlpnFront {
    fn drop(&mut self) {
        self.accepting.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An app (default `model.http`) whose model is the fake behind a TLS front offering
/// `protocols`; one turn has run, so the client holds a connection.
///
/// The client learns the server's choice on the first connection it opens: a server that
/// chooses HTTP/1.1 gets the call on that connection, as HTTP/1.1.
async fn app_behind(protocols: &[&str]) -> (App, AlpnFront) {
    let front = AlpnFront::start(protocols).await;
    let app = spawn(AppOptions {
        backend: Backend::Embedded,
        extra_env: vec![
            (
                "APTIX_LLM_BASE_URL",
                format!("https://127.0.0.1:{}/v1", front.port),
            ),
            (
                "APTIX_TLS_CA_FILE",
                front.dir.join("ca.pem").display().to_string(),
            ),
        ],
        fake: FakeOptions {
            latency: Duration::from_secs(1),
            ..FakeOptions::default()
        },
        ..AppOptions::default()
    })
    .await;
    front.upstream.send_replace(Some(app.fake.addr().port()));
    let body = json!({"sessionId": "alpn-first", "turnId": "t", "instruction": "hi"});
    let (status, body) = app
        .post_to(Some("tok-a"), "/api/ai/agent/execute", body.to_string())
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["kind"], "final", "{body}");
    (app, front)
}

/// Runs [`AT_ONCE`] turns of new sessions at once; every one completes, overlapping at the
/// model.
async fn turns_at_once(app: &App) {
    let sent = (0..AT_ONCE).map(|i| {
        let body = json!({"sessionId": format!("alpn-{i}"), "turnId": "t", "instruction": "hi"});
        app.post_to(Some("tok-a"), "/api/ai/agent/execute", body.to_string())
    });
    for (status, body) in futures_util::future::join_all(sent).await {
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["kind"], "final", "{body}");
    }
    assert_eq!(app.fake.requests().len(), AT_ONCE + 1);
    assert_eq!(
        app.fake.peak_in_flight(),
        AT_ONCE as u64,
        "the calls overlapped at the model"
    );
}

#[tokio::test]
async fn by_default_a_tls_server_that_offers_http2_gets_every_call_as_a_stream_of_one_connection() {
    let (app, front) = app_behind(&["h2", "http/1.1"]).await;
    assert_eq!(app.fake.connections(), 1, "the first call's connection");
    turns_at_once(&app).await;
    assert_eq!(app.fake.http2_requests(), AT_ONCE as u64 + 1);
    assert_eq!(
        app.fake.connections(),
        1,
        "the calls in flight shared the first call's connection"
    );
    assert_eq!(front.chosen(), vec![Some("h2".to_string())]);
}

#[tokio::test]
async fn by_default_a_tls_server_of_http1_alone_gets_a_connection_per_call_in_flight() {
    let (app, front) = app_behind(&["http/1.1"]).await;
    assert_eq!(app.fake.connections(), 1, "the first call's connection");
    turns_at_once(&app).await;
    assert_eq!(app.fake.http2_requests(), 0);
    // The first call's connection, idle again, carried one of them.
    assert_eq!(app.fake.connections(), AT_ONCE as u64);
    assert_eq!(front.chosen(), vec![Some("http/1.1".to_string()); AT_ONCE]);
}
