//! `aptix submit`, `status`, `watch` (through the HTTP API), `enqueue` (through the front door
//! in this process) and `validate` (the contract parser alone).

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use aptix_worker::app::App;
use aptix_worker::config::Config;
use aptix_worker::contract::{self, InvokeResult};
use aptix_worker::store::{TurnStatus, TurnStatusView};

use super::client::ApiClient;

/// Arguments of `aptix submit`.
#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    /// The AgentExecuteRequest JSON file.
    pub file: PathBuf,
    /// The API's base URL.
    #[arg(long, env = "APTIX_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Bearer token.
    #[arg(long, env = "APTIX_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the accepted status instead of waiting for the result.
    #[arg(long, conflicts_with = "stream")]
    pub no_wait: bool,
    /// Stream: print the answer's text as the model writes it (progress notes go to stderr),
    /// then the result (through the synchronous endpoint, with `"streaming": true`).
    #[arg(long)]
    pub stream: bool,
    /// How long to keep trying when the API cannot be reached or answers 502, 503 or 504 (a
    /// front door restarting), in seconds; 0 gives up at once. Sending the same request again
    /// is safe: its ids name the turn. (Not for `--stream`, whose text would be lost.)
    #[arg(long, default_value_t = 300)]
    pub retry_for_secs: u64,
}

/// Arguments of `aptix status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The session id.
    pub session_id: String,
    /// The turn id.
    pub turn_id: String,
    /// The API's base URL.
    #[arg(long, env = "APTIX_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Bearer token.
    #[arg(long, env = "APTIX_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// Arguments of `aptix enqueue`.
#[derive(Debug, clap::Args)]
pub struct EnqueueArgs {
    /// AgentExecuteRequest JSON files.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Arguments of `aptix validate`.
#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Request files to check.
    #[arg(required = true)]
    pub files: Vec<String>,
}

/// `aptix submit`.
pub async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let SubmitArgs {
        file,
        url,
        token,
        no_wait,
        stream,
        retry_for_secs,
    } = args;
    let body = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
    let client = ApiClient::new(&url, token);
    if stream {
        return submit_streaming(&client, body).await;
    }
    let client = client.with_patience(std::time::Duration::from_secs(retry_for_secs));
    let (status, accepted) = client.post("/v1/turns", body).await?;
    if status != 202 || no_wait {
        println!("{}", serde_json::to_string_pretty(&accepted)?);
        return Ok(if status == 202 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let accepted: InvokeResult<TurnStatusView> =
        serde_json::from_value(accepted).context("the API's 202 is not a turn status")?;
    let Some(view) = accepted.result() else {
        anyhow::bail!("the API accepted the turn without saying which");
    };
    let (sid, tid) = (view.session_id.clone(), view.turn_id.clone());
    loop {
        let (status, body) = client
            .get(&format!("/v1/sessions/{sid}/turns/{tid}?wait=30"))
            .await?;
        let polled: Option<InvokeResult<TurnStatusView>> = (status == 200)
            .then(|| serde_json::from_value(body.clone()))
            .transpose()
            .context("the API's turn status cannot be read")?;
        let view = polled.as_ref().and_then(InvokeResult::result);
        match view {
            Some(view) if !view.status.is_settled() => continue,
            Some(TurnStatusView {
                status,
                result: Some(result),
                ..
            }) => {
                println!("{}", serde_json::to_string_pretty(result)?);
                return Ok(
                    if matches!(status, TurnStatus::Failed | TurnStatus::Cancelled) {
                        ExitCode::FAILURE
                    } else {
                        ExitCode::SUCCESS
                    },
                );
            }
            _ => {
                println!("{}", serde_json::to_string_pretty(&body)?);
                let ok = view.is_some_and(|v| {
                    !matches!(v.status, TurnStatus::Failed | TurnStatus::Cancelled)
                });
                return Ok(if ok {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            }
        }
    }
}

/// `aptix submit --stream`: the text to stdout as it arrives, progress notes to stderr, then
/// the final `InvokeResult`.
async fn submit_streaming(client: &ApiClient, body: Vec<u8>) -> anyhow::Result<ExitCode> {
    use std::io::Write as _;
    let mut request: serde_json::Value = serde_json::from_slice(contract::without_bom(&body))
        .context("the request file is not JSON")?;
    if let Some(o) = request.as_object_mut() {
        o.insert("streaming".into(), serde_json::Value::Bool(true));
    }
    let mut final_result = None;
    let mut texted = false;
    let status = client
        .post_ndjson(
            "/api/ai/agent/execute",
            serde_json::to_vec(&request)?,
            |line| match line["kind"].as_str() {
                Some("delta") => {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(line["text"].as_str().unwrap_or_default().as_bytes());
                    let _ = out.flush();
                    texted = true;
                }
                Some("progress") => {
                    eprintln!("[{}]", line["message"].as_str().unwrap_or_default());
                }
                Some("final") => final_result = Some(line["final"].clone()),
                _ => final_result = Some(line),
            },
        )
        .await?;
    if texted {
        println!();
    }
    let Some(result) = final_result else {
        anyhow::bail!("the answer stream ended without a result (HTTP {status})");
    };
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(if result["successful"] == true {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `aptix status`.
pub async fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    turn_request(args, reqwest::Method::GET, "").await
}

/// `aptix cancel`: prints the turn's status after the request (`cancelled`, or `running`
/// while its worker stops it); exits non-zero when the API refused (a finished turn: 409).
pub async fn cancel(args: StatusArgs) -> anyhow::Result<ExitCode> {
    turn_request(args, reqwest::Method::POST, "/cancel").await
}

/// Sends one request about a turn (`/v1/sessions/{s}/turns/{t}{suffix}`), prints the answer,
/// and succeeds on 200 or 202.
async fn turn_request(
    args: StatusArgs,
    method: reqwest::Method,
    suffix: &str,
) -> anyhow::Result<ExitCode> {
    let StatusArgs {
        session_id,
        turn_id,
        url,
        token,
    } = args;
    let client = ApiClient::new(&url, token);
    let path = format!("/v1/sessions/{session_id}/turns/{turn_id}{suffix}");
    let (status, view) = client.send(client.request(method, &path)).await?;
    println!("{}", serde_json::to_string_pretty(&view)?);
    Ok(if status == 200 || status == 202 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `aptix enqueue`.
pub async fn enqueue(args: EnqueueArgs, config: Config) -> anyhow::Result<ExitCode> {
    let EnqueueArgs { files } = args;
    let app = App::build(&config).await?;
    let door = app.front_door(&config);
    let mut all_ok = true;
    for file in files {
        let body = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
        let submitted = match door.parse(&body) {
            Ok(request) => super::submit_local(&door, &request).await,
            Err(e) => Err(e),
        };
        match submitted {
            Ok(view) => println!("{}: {}", file.display(), serde_json::to_string(&view)?),
            Err(e) => {
                all_ok = false;
                println!(
                    "{}: {}",
                    file.display(),
                    serde_json::to_string_pretty(&e.into_invoke_result::<()>())?
                );
            }
        }
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `aptix validate`.
pub async fn validate(args: ValidateArgs, config: Config) -> anyhow::Result<ExitCode> {
    let ValidateArgs { files } = args;
    let mut all_valid = true;
    for file in files {
        let body = if file == "-" {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("reading stdin")?;
            buf
        } else {
            std::fs::read(&file).with_context(|| format!("reading {file}"))?
        };
        let result = match contract::parse_request(&body, &config.limits.request) {
            Ok(parsed) => InvokeResult::success(parsed.request).with_warnings(parsed.warnings),
            Err(rejected) => rejected.into_invoke_result(),
        };
        all_valid &= result.is_successful();
        println!("{file}: {}", serde_json::to_string_pretty(&result)?);
    }
    Ok(if all_valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
