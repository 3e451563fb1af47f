//! `aptix dlq`: list or requeue dead-lettered jobs (RabbitMQ only).

use std::process::ExitCode;

use serde_json::json;

use aptix_worker::config::Config;
use aptix_worker::queue::{JobQueue as _, RabbitBroker};

/// What `aptix dlq` does.
#[derive(Debug, clap::Subcommand)]
pub enum DlqAction {
    /// Print dead-lettered jobs with their reasons (they stay dead-lettered, moved to the back).
    List {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        max: usize,
    },
    /// Put dead-lettered jobs back on the job queue as fresh jobs.
    Requeue {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        max: usize,
    },
}

/// Arguments of `aptix dlq`.
#[derive(Debug, clap::Args)]
pub struct DlqArgs {
    #[command(subcommand)]
    pub action: DlqAction,
}

/// `aptix dlq`.
pub async fn dlq(args: DlqArgs) -> anyhow::Result<ExitCode> {
    let DlqArgs { action } = args;
    let config = Config::from_env()?;
    let Some(url) = &config.amqp_url else {
        anyhow::bail!("APTIX_AMQP_URL is not set: the dead-letter queue lives in RabbitMQ");
    };
    let broker = RabbitBroker::new(url.expose(), config.topology(), "aptix-dlq")
        .with_timeout(config.dependency_timeout)
        .with_tls_ca(config.tls_ca.clone());
    broker.connect().await?;
    match action {
        DlqAction::List { max } => {
            let dead = broker.drain_dead(max).await?;
            for (body, reason) in &dead {
                println!(
                    "{}",
                    json!({"reason": reason, "job": String::from_utf8_lossy(body)})
                );
                broker.publish_dead(body, 0, reason).await?;
            }
            eprintln!("{} dead-lettered job(s) listed", dead.len());
        }
        DlqAction::Requeue { max } => {
            let dead = broker.drain_dead(max).await?;
            for (body, _) in &dead {
                broker.publish_job(body).await?;
            }
            eprintln!("{} job(s) requeued", dead.len());
        }
    }
    Ok(ExitCode::SUCCESS)
}
