//! What a waiting request holds: the synchronous endpoint's future is the memory each call
//! waiting for its turn keeps, and what the server copies when it boxes it.

use std::marker::PhantomData;
use std::sync::Arc;

use axum::extract::State;

use crate::catalog::ModeCatalog;
use crate::config::BatchLimits;
use crate::contract::{RequestLimits, parse_request};
use crate::frontdoor::body::LimitedBody;
use crate::frontdoor::extract::{HttpParts, HttpState, Tenant, Traced};
use crate::frontdoor::{FrontDoor, Pickup};
use crate::metrics::Metrics;
use crate::queue::MemoryBroker;
use crate::rag::{ChunkOptions, MemoryIndex};
use crate::store::{MemoryStore, SessionStore};
use crate::tokens::ApiTokens;
use crate::trace::TraceContext;

fn state() -> HttpState {
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let broker = Arc::new(MemoryBroker::new());
    HttpState::new(HttpParts {
        door: FrontDoor::new(store.clone(), broker.clone(), RequestLimits::default()),
        store,
        broker,
        catalog: Arc::new(ModeCatalog::builtin()),
        tokens: ApiTokens::default(),
        limits: RequestLimits::default(),
        batch_limits: BatchLimits::default(),
        metrics: Arc::new(Metrics::new()),
        index: Arc::new(MemoryIndex::new()),
        chunk_options: ChunkOptions::default(),
        console: false,
        read_timeout: crate::frontdoor::http::HEADER_READ_TIMEOUT,
        mcp: None,
    })
}

/// The synchronous endpoint's future is what every waiting call keeps: the submission's
/// state is boxed (and freed once the turn is accepted), and so are the rare waits. The
/// submission's future is copied whole into its box on every call: the records it handles
/// are boxed, and so are the continuation's and the onBusy policies' steps. (Sizes of a debug
/// build, where the tests run: 3,560 B and 10,856 B before, 1,672 B and 1,600 B after.)
#[test]
fn a_waiting_synchronous_call_and_its_submission_are_small() {
    let state = state();
    let call = super::sync::execute_sync(
        State(state.clone()),
        Traced(TraceContext::new_root()),
        Tenant("local".into()),
        LimitedBody(axum::body::Bytes::new(), PhantomData),
    );
    let waiting = std::mem::size_of_val(&call);
    let body = br#"{"sessionId":"s","turnId":"t","instruction":"x"}"#;
    let request = parse_request(body, &RequestLimits::default())
        .expect("a valid turn")
        .request;
    let trace = TraceContext::new_root();
    let submit = state
        .door
        .submit("local", &request, &trace, Pickup::in_response(None));
    let submission = std::mem::size_of_val(&submit);
    eprintln!("a synchronous call: {waiting} B; its submission: {submission} B");
    assert!(waiting <= 2048, "a waiting call holds {waiting} B");
    assert!(submission <= 2048, "a submission is {submission} B");
}
