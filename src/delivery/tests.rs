//! The delivery's waits over the embedded broker and store (the RabbitMQ and Redis behaviour
//! of the same calls is in the integration tests).

use crate::store::{SessionStore as _, StoreReader as _};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::live::{LiveBody, LiveEvent};
use crate::queue::{MemoryBroker, ReplyBus as _, SessionEvent};
use crate::state::{TurnRecord, TurnStatus};
use crate::store::{Grant, MemoryStore};

struct Parts {
    store: Arc<MemoryStore>,
    broker: Arc<MemoryBroker>,
    delivery: ResultDelivery,
    sid: SessionId,
    tid: TurnId,
}

fn parts() -> Parts {
    let store = Arc::new(MemoryStore::new());
    let broker = Arc::new(MemoryBroker::new());
    let delivery = ResultDelivery::new(store.clone(), broker.clone());
    Parts {
        store,
        broker,
        delivery,
        sid: SessionId::parse("s").unwrap(),
        tid: TurnId::parse("t").unwrap(),
    }
}

impl Parts {
    /// The turn, stored as queued.
    async fn queued(&self) -> TurnRecord {
        let record = TurnRecord::queued(
            self.sid.clone(),
            self.tid.clone(),
            "fp".into(),
            "general".into(),
        );
        self.store
            .create_turn(&Grant::for_tests(), &record)
            .await
            .unwrap();
        record
    }

    /// Stores `from` as `status` (with a result when settled) and returns its view.
    async fn store_as(&self, from: &TurnRecord, status: TurnStatus) -> TurnRecord {
        let mut to = from.clone();
        to.status = status;
        if status.is_settled() {
            to.completed_at = Some("2026-11-26T00:00:00Z".into());
        }
        assert!(
            self.store
                .replace_turn(&Grant::for_tests(), from, &to)
                .await
                .unwrap()
        );
        to
    }

    fn live(&self, index: u64, text: &str) -> Vec<u8> {
        serde_json::to_vec(&LiveEvent {
            session_id: self.sid.to_string(),
            turn_id: self.tid.to_string(),
            index,
            body: LiveBody::Delta {
                text: text.into(),
                reached: None,
                call: None,
            },
        })
        .unwrap()
    }

    fn to_anyone() -> Addressee<'static> {
        Addressee {
            reply_to: None,
            audience: Audience::ANYONE,
            webhooks: Default::default(),
        }
    }
}

fn index_of(event: &SessionEvent) -> Option<u64> {
    match event {
        SessionEvent::Live(body) => serde_json::from_slice::<LiveEvent>(body)
            .ok()
            .map(|e| e.index),
        SessionEvent::Status(_) => None,
    }
}

/// A waiter for a turn whose continuation was accepted does not answer with the late copy of
/// the earlier run's `awaiting_client_tools`: it waits for the continuation's status.
#[tokio::test]
async fn a_late_awaiting_status_of_an_earlier_run_is_not_the_answer() {
    let p = parts();
    // The continuation was accepted: the stored turn is queued again.
    let record = p.queued().await;
    let Turn::Unsettled(mut listener) = p.delivery.turn(&p.sid, &p.tid).await.unwrap() else {
        panic!("a queued turn is listened for");
    };
    // The earlier run's status arrives late, ahead of the continuation's.
    let mut stale = TurnStatusView::from(&record);
    stale.status = TurnStatus::AwaitingClientTools;
    p.delivery
        .deliver(&stale, Parts::to_anyone())
        .await
        .unwrap();
    // The continuation's own status (as its run delivers it).
    let mut done = TurnStatusView::from(&record);
    done.status = TurnStatus::Completed;
    done.attempts = 2;
    p.delivery.deliver(&done, Parts::to_anyone()).await.unwrap();
    let got = listener
        .settled(Instant::now() + Duration::from_secs(5))
        .await
        .unwrap()
        .expect("a status")
        .into_view()
        .unwrap();
    assert_eq!((got.status, got.attempts), (TurnStatus::Completed, 2));
}

/// A listener that asked for live events gets the turn's text in order, then its status; the
/// events are kept in the store too, for a client that reconnects elsewhere.
#[tokio::test]
async fn a_listener_hears_the_live_text_then_the_status() {
    let p = parts();
    let record = p.queued().await;
    let mut listener = p.delivery.expect(&p.sid, &p.tid, true).await.unwrap();
    for (i, text) in ["Hel", "lo"].iter().enumerate() {
        p.delivery
            .publish_live(&p.sid, &p.tid, listener.address(), p.live(i as u64, text))
            .await;
    }
    let done = p.store_as(&record, TurnStatus::Completed).await;
    p.delivery
        .deliver(&TurnStatusView::from(&done), Parts::to_anyone())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut heard = Vec::new();
    loop {
        match listener.next(deadline).await.unwrap() {
            Heard::Live(e) => heard.push(e.index),
            Heard::Settled(settled) => {
                assert_eq!(settled.status(), TurnStatus::Completed);
                assert_eq!(settled.into_view().unwrap(), TurnStatusView::from(&done));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(heard, [0, 1]);
    assert_eq!(p.store.kept_live(&p.sid, &p.tid).await.unwrap().len(), 2);
}

/// Once its subscription has ended (a lost broker connection), a listener reads the store, at
/// least once a second: the turn's status there is the answer; at the deadline an unsettled
/// turn is answered as it is.
#[tokio::test(start_paused = true)]
async fn without_its_subscription_a_listener_reads_the_store() {
    let p = parts();
    let record = p.queued().await;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    drop(tx);
    let mut listener = p.delivery.listener((&p.sid, &p.tid), None, Some(rx), None);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(4);
    let Heard::Unsettled(view) = listener.next(deadline).await.unwrap() else {
        panic!("the deadline comes first");
    };
    assert_eq!(view.status, TurnStatus::Queued);
    assert!(Instant::now() >= deadline && Instant::now() < deadline + LONGEST_POLL);

    // Settled by another process 3 s later: found within a second of that.
    let writer = {
        let (store, record) = (p.store.clone(), record.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let mut to = record.clone();
            to.status = TurnStatus::Failed;
            store
                .replace_turn(&Grant::for_tests(), &record, &to)
                .await
                .unwrap();
        })
    };
    let from = Instant::now();
    let got = listener
        .settled(from + Duration::from_secs(60))
        .await
        .unwrap()
        .expect("a status");
    writer.await.unwrap();
    assert_eq!(got.status(), TurnStatus::Failed);
    let took = from.elapsed();
    assert!(
        took >= Duration::from_secs(3) && took <= Duration::from_secs(3) + LONGEST_POLL,
        "{took:?}"
    );
}

/// A follower that reconnects after live event 2 gets 3–5 from the store, then what is
/// published: a late live copy of an event it was sent from the store is not sent again; the
/// next event and the status are.
#[tokio::test]
async fn a_resuming_follower_gets_what_it_missed_once_then_the_rest() {
    let p = parts();
    let record = p.queued().await;
    for i in 0..6 {
        p.delivery
            .publish_live(&p.sid, &p.tid, None, p.live(i, "x"))
            .await;
    }
    let resume = Resume {
        turn: p.tid.clone(),
        after: Some(2),
    };
    let mut following = p.delivery.follow(&p.sid, Some(resume)).await.unwrap();
    // Published after the follower subscribed: index 5 again (a copy in flight while the
    // store was read), then 6, then the status.
    p.broker
        .publish_live(&p.sid, None, &p.live(5, "x"))
        .await
        .unwrap();
    p.delivery
        .publish_live(&p.sid, &p.tid, None, p.live(6, "x"))
        .await;
    let done = p.store_as(&record, TurnStatus::Completed).await;
    p.delivery
        .deliver(&TurnStatusView::from(&done), Parts::to_anyone())
        .await
        .unwrap();
    let mut got = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(5), following.next())
            .await
            .expect("the next event")
            .expect("the stream goes on");
        match index_of(&event) {
            Some(i) => got.push(i),
            None => break,
        }
    }
    assert_eq!(got, [3, 4, 5, 6]);
}

/// A follower that reconnects naming a turn that settled meanwhile gets its status first.
#[tokio::test]
async fn a_resuming_follower_gets_the_status_it_missed() {
    let p = parts();
    let record = p.queued().await;
    p.store_as(&record, TurnStatus::Completed).await;
    let resume = Resume {
        turn: p.tid.clone(),
        after: None,
    };
    let mut following = p.delivery.follow(&p.sid, Some(resume)).await.unwrap();
    let Some(SessionEvent::Status(body)) = following.next().await else {
        panic!("the missed status comes first");
    };
    let view: TurnStatusView = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (view.turn_id, view.status),
        (p.tid.clone(), TurnStatus::Completed)
    );
}

/// Reading a reply queue for one turn passes over other turns' statuses, unsettled ones and
/// bodies that are not a status; with nothing more, the deadline ends the wait.
#[tokio::test(start_paused = true)]
async fn a_reply_queue_reader_waits_for_its_turns_settled_status() {
    let p = parts();
    let mut reader = p
        .delivery
        .read_reply_queue(&p.sid, Duration::from_secs(60))
        .await
        .unwrap();
    let record = TurnRecord::queued(p.sid.clone(), p.tid.clone(), "fp".into(), "general".into());
    let status = |turn: &str, status: TurnStatus| {
        let mut view = TurnStatusView::from(&record);
        view.turn_id = TurnId::parse(turn).unwrap();
        view.status = status;
        serde_json::to_vec(&view).unwrap()
    };
    for body in [
        b"not a status".to_vec(),
        status("other", TurnStatus::Completed),
        status("t", TurnStatus::Running),
        status("t", TurnStatus::AwaitingClientTools),
    ] {
        p.broker
            .publish_reply(&p.sid, "t", None, Audience::ANYONE, &body)
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let Waited::Settled(view) = reader.settled(&p.tid, deadline).await else {
        panic!("the settled status of t is found");
    };
    assert_eq!(view.status, TurnStatus::AwaitingClientTools);
    let deadline = Instant::now() + Duration::from_secs(30);
    assert!(matches!(
        reader.settled(&p.tid, deadline).await,
        Waited::TimedOut
    ));
}
