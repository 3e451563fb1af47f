//! The broker conformance suite, its dead letters: a poisoned job keeps its reason, and a
//! sweep reads, keeps, requeues or discards each dead letter without losing or reordering the
//! rest — on the in-memory broker and on RabbitMQ.

use std::time::Duration;

use aptix_worker::queue::JobMeta;

use super::queue_conformance::{Subject, memory, next, nothing_within, rabbitmq};

async fn dead_letters_keep_their_reason(s: Subject) {
    s.broker
        .publish_dead(
            b"poison",
            &aptix_worker::queue::JobMeta::default().at_attempt(2),
            "unparseable job",
        )
        .await
        .unwrap();
    let dead = s.broker.drain_dead(10).await.unwrap();
    assert_eq!(
        dead,
        vec![(b"poison".to_vec(), "unparseable job".to_string())]
    );
    assert!(s.broker.drain_dead(10).await.unwrap().is_empty());
}

/// A sweep reads the dead letters without losing or reordering them, and requeues the ones
/// chosen as fresh jobs with their headers (tenant, batch, trace), keeping the rest in order.
async fn a_dead_letter_sweep_keeps_or_requeues_each_job_with_its_headers(s: Subject) {
    use aptix_worker::queue::DeadChoice;
    let meta = |n: u32| {
        JobMeta::new(Some("00-aa-bb-01"), Some("tenant-a"))
            .in_batch(Some("b1"))
            .replying_to(Some("gone-front-door"))
            .at_attempt(n)
    };
    for (i, body) in ["d0", "d1", "d2"].into_iter().enumerate() {
        s.broker
            .publish_dead(body.as_bytes(), &meta(i as u32 + 3), &format!("why {i}"))
            .await
            .unwrap();
    }
    let dead_depth = |depths: Vec<aptix_worker::queue::QueueDepth>| {
        depths
            .into_iter()
            .find(|q| q.role == "dead")
            .map(|q| q.messages)
    };
    assert_eq!(dead_depth(s.broker.depths().await.unwrap()), Some(3));
    // Read twice: the same jobs, in the same order, each once.
    for _ in 0..2 {
        let read = s
            .broker
            .sweep_dead(10, &|_| DeadChoice::Keep)
            .await
            .unwrap();
        let seen: Vec<(&[u8], &str, u32)> = read
            .iter()
            .map(|(l, _)| (&l.body[..], l.reason.as_str(), l.meta.attempt))
            .collect();
        assert_eq!(
            seen,
            vec![
                (&b"d0"[..], "why 0", 3),
                (&b"d1"[..], "why 1", 4),
                (&b"d2"[..], "why 2", 5)
            ]
        );
        assert_eq!(read[0].0.meta.tenant.as_deref(), Some("tenant-a"));
    }
    // Only what was there when the sweep began, and at most `max`.
    assert_eq!(
        s.broker
            .sweep_dead(2, &|_| DeadChoice::Keep)
            .await
            .unwrap()
            .len(),
        2
    );
    let requeued = s
        .broker
        .sweep_dead(10, &|l| {
            if l.body == b"d1" {
                DeadChoice::Requeue
            } else {
                DeadChoice::Keep
            }
        })
        .await
        .unwrap();
    assert_eq!(requeued.len(), 3);
    let mut d = s.broker.consume(10).await.unwrap();
    let x = next(&mut d).await;
    assert_eq!(x.body, b"d1");
    assert_eq!(
        x.meta(),
        JobMeta {
            attempt: 0,
            reply_to: None,
            ..meta(0)
        },
        "a fresh attempt of the same tenant, trace and batch, waited for by no one"
    );
    x.ack().await.unwrap();
    nothing_within(&mut d, 200).await;
    let left: Vec<Vec<u8>> = s
        .broker
        .sweep_dead(10, &|_| DeadChoice::Keep)
        .await
        .unwrap()
        .into_iter()
        .map(|(l, _)| l.body)
        .collect();
    assert_eq!(left.len(), 2);
    assert!(left.contains(&b"d0".to_vec()) && left.contains(&b"d2".to_vec()));
    // Discarded: gone from the dead letters, and not on the job queue either.
    let swept = s
        .broker
        .sweep_dead(10, &|l| {
            if l.body == b"d0" {
                DeadChoice::Discard
            } else {
                DeadChoice::Keep
            }
        })
        .await
        .unwrap();
    assert_eq!(swept.len(), 2);
    nothing_within(&mut d, 200).await;
    let left: Vec<Vec<u8>> = s
        .broker
        .sweep_dead(10, &|_| DeadChoice::Keep)
        .await
        .unwrap()
        .into_iter()
        .map(|(l, _)| l.body)
        .collect();
    assert_eq!(left, [b"d2".to_vec()]);
    // The broker counts acknowledgements as they arrive (they are not confirmed).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while dead_depth(s.broker.depths().await.unwrap()) != Some(1) {
        assert!(
            std::time::Instant::now() < deadline,
            "the depth never read 1"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

for_each_backend!(
    backends: [memory => super::memory(), rabbitmq => super::rabbitmq().await],
    tests: [
        dead_letters_keep_their_reason,
        a_dead_letter_sweep_keeps_or_requeues_each_job_with_its_headers,
    ],
);
