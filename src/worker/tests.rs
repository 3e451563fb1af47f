use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Worker, WorkerSettings};
use crate::queue::{JobMeta, JobQueue as _, MemoryBroker, Topology};

/// A turn's task is what each job in flight costs while it waits for the model, beside its
/// run (boxed apart by `Pipeline::execute_as`, bounded in `pipeline::tests`): it must not carry
/// copies of futures it is not running (an `async fn` that takes a future and awaits it holds
/// two), nor the largest of the rarely taken paths, nor the delivery of the result, which
/// starts once the run is over, nor a clone of the worker, nor a retry's republishing (1,616
/// bytes with rustc 1.95; 1,944 with the republishing inline; 3.4 KB with the worker cloned
/// into it and its turn moved into a `select!`; 7.4 KB with the delivery unboxed).
#[tokio::test]
async fn the_task_a_turn_runs_on_stays_small() {
    let broker = Arc::new(MemoryBroker::new());
    let store = Arc::new(crate::store::MemoryStore::new());
    let llm = crate::llm::LlmClient::new(
        "http://127.0.0.1:9/v1",
        None,
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(1),
        0,
    )
    .unwrap();
    let pipeline = crate::pipeline::Pipeline::new(
        store,
        Arc::new(crate::catalog::ModeCatalog::builtin()),
        llm,
        crate::pipeline::PipelineSettings::new("m"),
    )
    .unwrap();
    let worker = Arc::new(Worker::new(
        broker.clone(),
        pipeline,
        Topology::new("size"),
        WorkerSettings::default(),
    ));
    let job = br#"{"sessionId":"s","turnId":"t","instruction":"hi"}"#;
    broker
        .enqueue(None, job, &JobMeta::default())
        .await
        .unwrap();
    let mut jobs = broker.consume(1).await.unwrap();
    let delivery = jobs.recv().await.unwrap();
    let request = crate::contract::parse_request(job, &worker.settings.limits)
        .unwrap()
        .request;
    let execute = worker
        .pipeline
        .execute(&request, std::time::Duration::from_secs(1));
    let turn = std::mem::size_of_val(&execute);
    let task = worker.turn_task(delivery, CancellationToken::new(), CancellationToken::new());
    let size = std::mem::size_of_val(&task);
    eprintln!("pipeline {turn} B, task {size} B");
    assert!(
        size < turn + 1536,
        "the task ({size} B) is much larger than the turn it runs ({turn} B)"
    );
}
