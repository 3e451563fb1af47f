//! A headless Chromium of a test's own: Debian's `chromium`, driven through its own
//! `chromedriver` (both from Debian's packages; `.ci/run` installs them), with the waits and
//! clicks the console tests use. Screenshots go to `target/tmp/console/`.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

/// A `chromedriver` of its own, and a headless Chromium session on it.
pub struct Browser {
    driver: Child,
    pub client: Client,
    shots: std::path::PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    pub async fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts (apt-get install chromium chromium-driver; .ci/run does)");
        let caps = json!({"goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-quic", "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--window-size=1280,1100"]
        }});
        let caps = caps.as_object().cloned().unwrap_or_default();
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) => {
                    assert!(Instant::now() < deadline, "no browser session: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console");
        std::fs::create_dir_all(&shots).expect("a folder for screenshots");
        Self {
            driver,
            client,
            shots,
        }
    }

    /// Waits (up to `within`) until `css` matches an element whose text satisfies `ok`;
    /// returns that text.
    pub async fn text_when(
        &self,
        css: &str,
        within: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + within;
        let mut last = String::new();
        loop {
            if let Ok(el) = self.client.find(Locator::Css(css)).await
                && let Ok(text) = el.text().await
            {
                if ok(&text) {
                    return text;
                }
                last = text;
            }
            assert!(
                Instant::now() < deadline,
                "{css} never showed what was wanted; last: {last:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The attribute `name` of the first element `css` matches (`None` when it has none).
    pub async fn attr(&self, css: &str, name: &str) -> Option<String> {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"))
            .attr(name)
            .await
            .unwrap_or_else(|e| panic!("cannot read {name} of {css}: {e}"))
    }

    pub async fn count(&self, css: &str) -> usize {
        self.client
            .find_all(Locator::Css(css))
            .await
            .map(|v| v.len())
            .unwrap_or(0)
    }

    pub async fn click(&self, css: &str) {
        self.client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"))
            .click()
            .await
            .unwrap_or_else(|e| panic!("cannot click {css}: {e}"));
    }

    /// Clicks the button or link a person would by its text, `name` (within the element `css`
    /// matches, when given): how the tests find what they act on.
    pub async fn press(&self, within: Option<&str>, name: &str) {
        assert!(!name.contains('\''), "a name without quotes: {name}");
        let scope = within.map_or_else(String::new, |css| format!("{css} "));
        let xpath = format!(
            "//*[(self::button or self::a or @role='button') and normalize-space(.)='{name}']"
        );
        let found = match within {
            None => {
                self.client
                    .wait()
                    .at_most(Duration::from_secs(10))
                    .for_element(Locator::XPath(&xpath))
                    .await
            }
            Some(css) => {
                let outer = self
                    .client
                    .wait()
                    .at_most(Duration::from_secs(10))
                    .for_element(Locator::Css(css))
                    .await
                    .unwrap_or_else(|e| panic!("no {css}: {e}"));
                outer.find(Locator::XPath(&format!(".{xpath}"))).await
            }
        };
        found
            .unwrap_or_else(|e| panic!("no button or link {scope}\"{name}\": {e}"))
            .click()
            .await
            .unwrap_or_else(|e| panic!("cannot press {scope}\"{name}\": {e}"));
    }

    /// Chooses the file at `path` in the file field whose label contains `label`, as a person
    /// picking it in the dialog would.
    pub async fn attach(&self, label: &str, path: &std::path::Path) {
        assert!(!label.contains('\''), "a label without quotes: {label}");
        let xpath = format!(
            "//input[@type='file' and @id=//label[contains(normalize-space(.), '{label}')]/@for]"
        );
        self.client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::XPath(&xpath))
            .await
            .unwrap_or_else(|e| panic!("no file field labelled \"{label}\": {e}"))
            .send_keys(&path.display().to_string())
            .await
            .unwrap_or_else(|e| panic!("cannot choose {}: {e}", path.display()));
    }

    pub async fn sign_in(&self, base: &str, token: &str) {
        self.client
            .goto(&format!("{base}/console"))
            .await
            .expect("the console loads");
        let field = self
            .client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css("#token"))
            .await
            .expect("the sign-in form");
        field.send_keys(token).await.expect("typing the token");
        self.click("#token-form button").await;
    }

    pub async fn show(&self, base: &str, fragment: &str) {
        self.client
            .goto(&format!("{base}/console#{fragment}"))
            .await
            .expect("navigates");
    }

    /// Answers the confirmation the page asks (waiting up to 10 s for it to show): accepts
    /// or dismisses it; returns its text.
    pub async fn confirm(&self, accept: bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        let text = loop {
            match self.client.get_alert_text().await {
                Ok(text) => break text,
                Err(e) => {
                    assert!(Instant::now() < deadline, "no confirmation was asked: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let answered = match accept {
            true => self.client.accept_alert().await,
            false => self.client.dismiss_alert().await,
        };
        answered.unwrap_or_else(|e| panic!("cannot answer {text:?}: {e}"));
        text
    }

    /// Whether the page is wider than the window (a person would have to scroll sideways)
    /// at a window `width` pixels wide.
    pub async fn overflows_at(&self, width: u32) -> bool {
        self.client
            .set_window_size(width, 1000)
            .await
            .expect("the window resizes");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let wider = self
            .client
            .execute(
                "return document.documentElement.scrollWidth > window.innerWidth;",
                vec![],
            )
            .await
            .expect("the page answers");
        wider.as_bool().unwrap_or(true)
    }

    pub async fn shot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("a screenshot");
        std::fs::write(self.shots.join(format!("{name}.png")), png).expect("written");
    }
}
