//! The console (`/console`, on with `APTIX_CONSOLE`): a page a person opens to look into turns,
//! batches and (admins) the system. It is static — one HTML page, a script and a style sheet,
//! and the chart library (`vendor/`), embedded in the binary, no CDN — and calls the public
//! HTTP API with the token the person enters, so it sees exactly what that token may see and
//! adds no way in of its own.
//!
//! Owns: serving the assets. Must not: read state itself (the page reads the API).

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::extract::HttpState;

const PAGE: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("console.js");
const STYLE: &str = include_str!("console.css");
/// The chart library (see `vendor/README.md`).
const CHARTS: &str = include_str!("vendor/uPlot.iife.min.js");
const CHARTS_STYLE: &str = include_str!("vendor/uPlot.min.css");

/// What the page may load and run: its own assets and the API, nothing else.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

fn asset(body: &'static str, kind: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `/console` and its assets.
pub(super) fn routes() -> Router<HttpState> {
    Router::new()
        .route(
            "/console",
            get(|| async { asset(PAGE, "text/html; charset=utf-8") }),
        )
        .route(
            "/console/console.js",
            get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/console/console.css",
            get(|| async { asset(STYLE, "text/css; charset=utf-8") }),
        )
        .route(
            "/console/vendor/uPlot.iife.min.js",
            get(|| async { asset(CHARTS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/console/vendor/uPlot.min.css",
            get(|| async { asset(CHARTS_STYLE, "text/css; charset=utf-8") }),
        )
}
