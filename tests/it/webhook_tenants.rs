//! Each tenant's webhooks are signed with a secret no other tenant holds: without secrets of
//! their own in the tenants file, tenants sign with secrets derived from the deployment's
//! (`aptix webhooks secret <tenant>` prints one), and the signed body names the tenant. Two
//! tenants' deliveries to one receiver verify — with the Standard Webhooks package for Python —
//! only with their own secrets, never with the other's or the deployment's.

use std::time::Duration;

use serde_json::Value;

use crate::app::{AppOptions, Backend, spawn};
use crate::webhooks::{Receiver, SECRET, turn_with_webhook, verify_with, webhook_env};

/// `aptix webhooks secret <tenant>`, from outside, with the deployment's secret.
fn secret_of(tenant: &str) -> String {
    let out = crate::support::aptix()
        .args(["webhooks", "secret", tenant])
        .env("APTIX_WEBHOOK_SECRET", SECRET)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn two_tenants_deliveries_verify_only_with_their_own_secrets(backend: Backend) {
    let receiver = Receiver::start([]).await;
    let app = spawn(AppOptions {
        backend,
        extra_env: webhook_env(&[]),
        ..AppOptions::default()
    })
    .await;
    for (token, session) in [("tok-a", "sa"), ("tok-b", "sb")] {
        let (status, body) = app
            .post(Some(token), turn_with_webhook(session, "t", &receiver.url))
            .await;
        assert_eq!(status, 202, "{body}");
    }
    let got = receiver
        .until(Duration::from_secs(30), |got| got.len() >= 2)
        .await;
    let of = |tenant: &str| {
        got.iter()
            .filter(|r| serde_json::from_str::<Value>(&r.body).unwrap()["tenant"] == tenant)
            .cloned()
            .collect::<Vec<_>>()
    };
    let (a, b) = (of("tenant-a"), of("tenant-b"));
    assert_eq!((a.len(), b.len()), (1, 1), "{got:#?}");
    let (secret_a, secret_b) = (secret_of("tenant-a"), secret_of("tenant-b"));
    assert!(secret_a.starts_with("whsec_") && secret_a != secret_b && secret_a != SECRET);
    // Each verifies with its tenant's secret, as the CLI prints it and as the verifier
    // derives it from the deployment's by the README's rule.
    assert_eq!(verify_with(&secret_a, None, &a), Ok(()));
    assert_eq!(verify_with(&secret_b, None, &b), Ok(()));
    assert_eq!(verify_with(SECRET, Some("tenant-a"), &a), Ok(()));
    // Never with the other tenant's, nor with the deployment's own: B cannot replay its own
    // events to A's receiver, or sign any.
    assert!(verify_with(&secret_b, None, &a).is_err());
    assert!(verify_with(&secret_a, None, &b).is_err());
    assert!(verify_with(SECRET, None, &a).is_err());
    assert!(verify_with(SECRET, None, &b).is_err());
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [two_tenants_deliveries_verify_only_with_their_own_secrets],
);
