//! Span export over OTLP/HTTP (protobuf) to the collector named by the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). The exporter reads
//! the standard variables itself (endpoint, headers, timeout, `OTEL_BSP_*` batching,
//! `OTEL_SERVICE_NAME`); the requests go out through the process's own reqwest client, with the
//! same crypto provider and `APTIX_TLS_CA_FILE` as every other connection.
//!
//! Owns: the tracer provider and its HTTP client. Must not: decide which spans exist.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

use super::TelemetryError;

/// A collector that answers with more than this is not read further.
const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// Whether the environment asks for span export.
pub fn requested() -> bool {
    super::EXPORT_VARS
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()))
}

/// The exporter's HTTP client: reqwest, driven on the process's tokio runtime. The batch
/// processor exports from a thread of its own, which has no runtime; each request is spawned
/// onto the one captured here and awaited from there.
#[derive(Debug)]
struct RuntimeClient {
    http: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for RuntimeClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request: reqwest::Request = request.try_into()?;
        let http = self.http.clone();
        let sent = self.runtime.spawn(async move {
            let mut response = http.execute(request).await?;
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await? {
                if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok::<_, reqwest::Error>((response.status(), body))
        });
        let (status, body) = sent.await??;
        Ok(Response::builder().status(status).body(Bytes::from(body))?)
    }
}

/// Builds the tracer provider (batching, OTLP/HTTP) for `default_service` unless
/// `OTEL_SERVICE_NAME` names another. Must run inside the tokio runtime.
pub fn provider(
    default_service: &str,
    ca: Option<&crate::tls::ExtraCa>,
) -> Result<SdkTracerProvider, TelemetryError> {
    crate::tls::install_crypto_provider();
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| TelemetryError::NoRuntime)?;
    let http = crate::tls::http_client_builder(ca)
        .and_then(|b| {
            b.connect_timeout(Duration::from_secs(3))
                .timeout(Duration::from_secs(10))
                .build()
        })
        .map_err(|e| TelemetryError::Exporter(format!("cannot build the HTTP client: {e}")))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_http_client(RuntimeClient { http, runtime })
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let mut resource = Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(default_service.to_string());
    }
    Ok(SdkTracerProvider::builder()
        .with_resource(resource.build())
        .with_batch_exporter(exporter)
        .build())
}

/// The tracing layer that turns spans into exported OpenTelemetry spans.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("aptix"))
}
