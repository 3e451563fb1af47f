//! `aptix webhooks`: the webhook deliveries that never succeeded — list them, or send them
//! again — and the secret a tenant's receiver verifies with. Dead deliveries are read through
//! a deployment's API with `--url` (any broker, the embedded one of `aptix run` included), or
//! straight from RabbitMQ with `APTIX_AMQP_URL`.

use std::process::ExitCode;

use aptix_worker::config::Config;
use aptix_worker::queue::RabbitBroker;
use aptix_worker::webhooks::dead::{self, DeadDelivery};

use super::client::ApiClient;

/// What `aptix webhooks` does.
#[derive(Debug, clap::Subcommand)]
pub enum WebhooksAction {
    /// Print the dead deliveries (one JSON object per line: event id and type, URL, tenant,
    /// attempts, the reason and the last error); they stay where they are.
    Failed {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        max: usize,
        #[command(flatten)]
        api: Through,
    },
    /// Send dead deliveries again, each as a fresh delivery of the same event (same
    /// `webhook-id`, the retry schedule from its start).
    Replay {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        max: usize,
        #[command(flatten)]
        api: Through,
    },
    /// Print the `whsec_…` secret `tenant`'s deliveries are signed with when the tenants file
    /// names no secret of its own for it (derived from `APTIX_WEBHOOK_SECRET`): what the
    /// tenant's receiver verifies with.
    Secret {
        /// The tenant.
        tenant: String,
    },
}

/// Where dead deliveries are read: a deployment's API, else RabbitMQ (`APTIX_AMQP_URL`).
#[derive(Debug, clap::Args)]
pub struct Through {
    /// A deployment's API base URL (an admin token's): its broker's dead deliveries, whichever
    /// broker it runs.
    #[arg(long, env = "APTIX_URL")]
    url: Option<String>,
    /// Bearer token (an admin's).
    #[arg(long, env = "APTIX_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// Arguments of `aptix webhooks`.
#[derive(Debug, clap::Args)]
pub struct WebhooksArgs {
    #[command(subcommand)]
    pub action: WebhooksAction,
}

/// `aptix webhooks`.
pub async fn webhooks(args: WebhooksArgs, config: Config) -> anyhow::Result<ExitCode> {
    let WebhooksArgs { action } = args;
    let (max, replay, api) = match action {
        WebhooksAction::Failed { max, api } => (max, false, api),
        WebhooksAction::Replay { max, api } => (max, true, api),
        WebhooksAction::Secret { tenant } => return secret(&config, &tenant),
    };
    if let Some(url) = &api.url {
        return through_api(&ApiClient::new(url, api.token.clone()), max, replay).await;
    }
    let Some(amqp) = &config.broker.url else {
        anyhow::bail!(
            "name where the dead deliveries are: --url (or APTIX_URL) of the deployment's API — the embedded broker of `aptix run` is reached only through it — or APTIX_AMQP_URL for RabbitMQ"
        );
    };
    let broker = RabbitBroker::new(amqp.expose(), config.topology(), "aptix-webhooks")
        .with_timeout(config.dependency_timeout)
        .with_tls_ca(config.tls_ca.clone());
    broker.connect().await?;
    if replay {
        let replayed = dead::replay(&broker, max).await?;
        eprintln!("{replayed} webhook delivery(ies) sent again");
    } else {
        print_dead(&dead::list(&broker, max).await?)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The same through a deployment's `/v1/admin/webhooks/dead`.
async fn through_api(api: &ApiClient, max: usize, replay: bool) -> anyhow::Result<ExitCode> {
    let (status, body) = if replay {
        let path = format!("/v1/admin/webhooks/dead/replay?limit={max}");
        api.post(&path, Vec::new()).await?
    } else {
        api.get(&format!("/v1/admin/webhooks/dead?limit={max}"))
            .await?
    };
    if status != 200 {
        anyhow::bail!("the API answered {status}: {body}");
    }
    if replay {
        eprintln!(
            "{} webhook delivery(ies) sent again",
            body["result"]["replayed"]
        );
    } else {
        let dead: Vec<DeadDelivery> = serde_json::from_value(body["result"].clone())?;
        print_dead(&dead)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_dead(dead: &[DeadDelivery]) -> anyhow::Result<()> {
    for d in dead {
        println!("{}", serde_json::to_string(d)?);
    }
    eprintln!("{} failed webhook delivery(ies)", dead.len());
    Ok(())
}

/// `aptix webhooks secret <tenant>`: the secret that signs the tenant's deliveries, as its
/// receiver is given it.
fn secret(config: &Config, tenant: &str) -> anyhow::Result<ExitCode> {
    use aptix_worker::webhooks::{DEFAULT_SECRET_ENV, Target, signing_key};
    let own = config.limits.tenants.signing_env(tenant);
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
