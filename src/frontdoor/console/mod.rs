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

/// The page, its scripts (one per page of the console, `console.js` first: the helpers and
/// the routing the others use), its style sheet and the chart library (see `vendor/README.md`),
/// by path.
const ASSETS: &[(&str, &str, &str)] = &[
    ("/console", include_str!("index.html"), HTML),
    ("/console/console.js", include_str!("console.js"), SCRIPT),
    ("/console/runs.js", include_str!("runs.js"), SCRIPT),
    (
        "/console/inspector.js",
        include_str!("inspector.js"),
        SCRIPT,
    ),
    ("/console/timeline.js", include_str!("timeline.js"), SCRIPT),
    ("/console/batches.js", include_str!("batches.js"), SCRIPT),
    ("/console/overview.js", include_str!("overview.js"), SCRIPT),
    ("/console/system.js", include_str!("system.js"), SCRIPT),
    ("/console/console.css", include_str!("console.css"), STYLE),
    (
        "/console/vendor/uPlot.iife.min.js",
        include_str!("vendor/uPlot.iife.min.js"),
        SCRIPT,
    ),
    (
        "/console/vendor/uPlot.min.css",
        include_str!("vendor/uPlot.min.css"),
        STYLE,
    ),
];
const HTML: &str = "text/html; charset=utf-8";
const SCRIPT: &str = "text/javascript; charset=utf-8";
const STYLE: &str = "text/css; charset=utf-8";

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
    ASSETS
        .iter()
        .fold(Router::new(), |router, &(path, body, kind)| {
            router.route(path, get(move || async move { asset(body, kind) }))
        })
}
