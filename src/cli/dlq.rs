//! `aptix dlq`: list, requeue or discard dead-lettered jobs (RabbitMQ only).

use std::process::ExitCode;

use serde_json::json;

use aptix_worker::config::Config;
use aptix_worker::queue::{DeadChoice, JobQueue as _, RabbitBroker};

/// What `aptix dlq` does.
#[derive(Debug, clap::Subcommand)]
pub enum DlqAction {
    /// Print dead-lettered jobs with their reasons (they stay dead-lettered, in the same order
    /// when all of them are listed).
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
    /// Take dead-lettered jobs out of the dead-letter queue for good (the oldest first; their
    /// turns stay as they are).
    Discard {
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
pub async fn dlq(args: DlqArgs, config: Config) -> anyhow::Result<ExitCode> {
    let DlqArgs { action } = args;
    let Some(url) = &config.broker.url else {
        anyhow::bail!("APTIX_AMQP_URL is not set: the dead-letter queue lives in RabbitMQ");
    };
    let broker = RabbitBroker::new(url.expose(), config.topology(), "aptix-dlq")
        .with_timeout(config.dependency_timeout)
        .with_tls_ca(config.tls_ca.clone());
    broker.connect().await?;
    // A sweep publishes each job where it goes before taking it from the dead-letter queue:
    // an interrupted command leaves a job twice, never loses one.
    match action {
        DlqAction::List { max } => {
            let dead = broker.sweep_dead(max, &|_| DeadChoice::Keep).await?;
            for (letter, _) in &dead {
                println!(
                    "{}",
                    json!({"reason": letter.reason, "attempt": letter.meta.attempt, "tenant": letter.meta.tenant, "job": String::from_utf8_lossy(&letter.body)})
                );
            }
            eprintln!("{} dead-lettered job(s) listed", dead.len());
        }
        DlqAction::Requeue { max } => {
            let dead = broker.sweep_dead(max, &|_| DeadChoice::Requeue).await?;
            eprintln!("{} job(s) requeued", dead.len());
        }
        DlqAction::Discard { max } => {
            let dead = broker.sweep_dead(max, &|_| DeadChoice::Discard).await?;
            for (letter, _) in &dead {
                tracing::info!(reason = %letter.reason, tenant = ?letter.meta.tenant, "dead letter discarded");
            }
            eprintln!("{} job(s) discarded", dead.len());
        }
    }
    Ok(ExitCode::SUCCESS)
}
