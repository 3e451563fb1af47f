//! `aptix webhooks`: the webhook deliveries that never succeeded — list them, or send them
//! again (RabbitMQ only: the embedded broker's live in its own process).

use std::process::ExitCode;

use serde_json::json;

use aptix_worker::config::Config;
use aptix_worker::queue::{HookQueue as _, RabbitBroker};
use aptix_worker::webhooks::HookJob;

/// What `aptix webhooks` does.
#[derive(Debug, clap::Subcommand)]
pub enum WebhooksAction {
    /// Print the dead deliveries (one JSON object per line: event id and type, URL, tenant,
    /// attempts, the reason and the last error); they stay where they are.
    Failed {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        max: usize,
    },
    /// Send dead deliveries again, each as a fresh delivery of the same event (same
    /// `webhook-id`, the retry schedule from its start).
    Replay {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        max: usize,
    },
    /// Print the `whsec_…` secret `tenant`'s deliveries are signed with when the tenants file
    /// names no secret of its own for it (derived from `APTIX_WEBHOOK_SECRET`): what the
    /// tenant's receiver verifies with.
    Secret {
        /// The tenant.
        tenant: String,
    },
}

/// Arguments of `aptix webhooks`.
#[derive(Debug, clap::Args)]
pub struct WebhooksArgs {
    #[command(subcommand)]
    pub action: WebhooksAction,
}

/// `aptix webhooks`.
pub async fn webhooks(args: WebhooksArgs) -> anyhow::Result<ExitCode> {
    let WebhooksArgs { action } = args;
    let config = Config::from_env()?;
    let (max, replay) = match action {
        WebhooksAction::Failed { max } => (max, false),
        WebhooksAction::Replay { max } => (max, true),
        WebhooksAction::Secret { tenant } => return secret(&config, &tenant),
    };
    let Some(url) = &config.amqp_url else {
        anyhow::bail!(
            "APTIX_AMQP_URL is not set: dead webhook deliveries live in RabbitMQ (the embedded broker keeps them in its own process)"
        );
    };
    let broker = RabbitBroker::new(url.expose(), config.topology(), "aptix-webhooks")
        .with_timeout(config.dependency_timeout)
        .with_tls_ca(config.tls_ca.clone());
    broker.connect().await?;
    match replay {
        false => {
            let dead = broker.dead_hooks(max, false).await?;
            for (body, reason) in &dead {
                let line = match serde_json::from_slice::<HookJob>(body) {
                    Ok(job) => json!({
                        "eventId": job.id, "event": job.event.as_str(), "url": job.target.url,
                        "tenant": job.tenant, "attempts": job.attempts, "firstAt": job.first_at,
                        "reason": reason, "lastError": job.last_error,
                    }),
                    Err(_) => json!({"reason": reason, "body": String::from_utf8_lossy(body)}),
                };
                println!("{line}");
            }
            eprintln!("{} failed webhook delivery(ies)", dead.len());
        }
        true => {
            let dead = broker.dead_hooks(max, true).await?;
            let mut replayed = 0;
            for (body, reason) in dead {
                let Ok(mut job) = serde_json::from_slice::<HookJob>(&body) else {
                    // Not a delivery at all: it stays dead.
                    broker.dead_hook(&body, &reason).await?;
                    continue;
                };
                job.attempts = 0;
                job.first_at = time::OffsetDateTime::now_utc().unix_timestamp();
                job.last_error = None;
                broker.enqueue_hook(&serde_json::to_vec(&job)?).await?;
                replayed += 1;
            }
            eprintln!("{replayed} webhook delivery(ies) sent again");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `aptix webhooks secret <tenant>`: the secret that signs the tenant's deliveries, as its
/// receiver is given it.
fn secret(config: &Config, tenant: &str) -> anyhow::Result<ExitCode> {
    use aptix_worker::webhooks::{DEFAULT_SECRET_ENV, Target, signing_key};
    let own = config.tenants.signing_env(tenant);
    let target = Target {
        url: String::new(),
        secret_env: own.to_string(),
    };
    let Some(key) = signing_key(&config.webhooks.secrets, &target, tenant) else {
        anyhow::bail!("{own} is not set: the tenant's deliveries cannot be signed here");
    };
    if own != DEFAULT_SECRET_ENV {
        eprintln!("{tenant} signs with its own secret, from {own} (the tenants file names it)");
    }
    println!("{}", key.encoded());
    Ok(ExitCode::SUCCESS)
}
