//! Group commit: writes that callers hand in one at a time, written together. One task per
//! process writes whatever is waiting in one go, and while a go is in flight the next one
//! gathers, so a quiet process writes each item at once (no waiting for company) and a busy
//! one writes many per round trip. Each caller waits for the go that carried its item and gets
//! that go's answer for it.
//!
//! The task is started by the first item handed in (in the caller's runtime) and again by the
//! next item if it has stopped (its runtime ended); it ends when its [`GroupCommit`] is dropped.
//!
//! Owns: gathering items into goes and handing each caller its answer. Must not: know what is
//! written (the writer given at the start does).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, oneshot};

/// The most items one go carries; more wait for the next.
pub(super) const MOST_AT_ONCE: usize = 512;

/// What a writer answers for each item of a go, in the order handed to it.
pub(super) type Answers = Vec<Result<(), String>>;

/// Writes one go of items.
pub(super) type Writer<T> =
    Box<dyn FnMut(Vec<T>) -> Pin<Box<dyn Future<Output = Answers> + Send>> + Send>;

/// The answer for an item handed in: asked for after other work, it is usually there already
/// (a note is written in less time than a job's publisher confirm takes), and then the
/// asking costs no wake-up.
pub(super) struct Answer {
    answered: Result<oneshot::Receiver<Result<(), String>>, String>,
}

impl Answer {
    /// The answer of the go that wrote the item.
    pub(super) async fn wait(self) -> Result<(), String> {
        match self.answered {
            Ok(answered) => answered
                .await
                .unwrap_or_else(|_| Err("the writer stopped before it answered".into())),
            Err(e) => Err(e),
        }
    }
}

/// An item, who waits for its answer, and its place in the count of items not written yet.
struct Waiting<T> {
    item: T,
    answer: oneshot::Sender<Result<(), String>>,
    unwritten: UnderWay,
}

/// Items written together (see the module header).
pub(super) struct GroupCommit<T> {
    queue: Mutex<Option<mpsc::UnboundedSender<Waiting<T>>>>,
    /// Items handed in and not written yet (answered, or dropped with a task that stopped).
    unwritten: Arc<AtomicUsize>,
}

impl<T> Default for GroupCommit<T> {
    fn default() -> Self {
        Self {
            queue: Mutex::new(None),
            unwritten: Arc::default(),
        }
    }
}

/// Counts something as under way until it is dropped (done, or given up).
pub(super) struct UnderWay(Arc<AtomicUsize>);

impl UnderWay {
    /// Counts one more under way in `count`; how many were before it.
    pub(super) fn enter(count: &Arc<AtomicUsize>) -> (usize, Self) {
        (count.fetch_add(1, Ordering::Relaxed), Self(count.clone()))
    }
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<T: Send + 'static> GroupCommit<T> {
    /// Whether items are waiting to be written or being written: an item handed in now would
    /// have company. (An item written and answered no longer counts, whether or not its caller
    /// has asked for the answer yet.)
    pub(super) fn busy(&self) -> bool {
        self.unwritten.load(Ordering::Relaxed) > 0
    }

    /// Hands `item` in now, to be written by the next go; the [`Answer`] is that go's for it.
    /// `writer` makes the writer of a task that has to be started (the first item, or the
    /// first after the task stopped).
    pub(super) fn hand_in(&self, item: T, writer: impl FnOnce() -> Writer<T>) -> Answer {
        let (_, unwritten) = UnderWay::enter(&self.unwritten);
        let (answer, answered) = oneshot::channel();
        let waiting = Waiting {
            item,
            answer,
            unwritten,
        };
        Answer {
            answered: self.queue_up(waiting, writer).map(|()| answered),
        }
    }

    /// Hands `item` in and waits for its answer.
    #[cfg(test)]
    async fn write(&self, item: T, writer: impl FnOnce() -> Writer<T>) -> Result<(), String> {
        self.hand_in(item, writer).wait().await
    }

    /// Puts `waiting` in the task's queue, starting the task first if there is none.
    fn queue_up(
        &self,
        waiting: Waiting<T>,
        writer: impl FnOnce() -> Writer<T>,
    ) -> Result<(), String> {
        let mut queue = self
            .queue
            .lock()
            .map_err(|_| "the group commit's queue is poisoned".to_string())?;
        let waiting = match queue.as_ref() {
            Some(q) => match q.send(waiting) {
                Ok(()) => return Ok(()),
                // The task stopped (its runtime ended): start another.
                Err(mpsc::error::SendError(back)) => back,
            },
            None => waiting,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, writer()));
        tx.send(waiting)
            .map_err(|_| "the group commit's writer did not start".to_string())?;
        *queue = Some(tx);
        Ok(())
    }
}

/// The task: a go of everything waiting (up to [`MOST_AT_ONCE`]) each time the previous go
/// is answered.
async fn run<T>(mut queue: mpsc::UnboundedReceiver<Waiting<T>>, mut writer: Writer<T>) {
    while let Some(first) = queue.recv().await {
        let mut go = vec![first];
        while go.len() < MOST_AT_ONCE {
            match queue.try_recv() {
                Ok(next) => go.push(next),
                Err(_) => break,
            }
        }
        let (items, waiters): (Vec<T>, Vec<_>) = go
            .into_iter()
            .map(|w| (w.item, (w.answer, w.unwritten)))
            .unzip();
        let mut answers = writer(items).await.into_iter();
        // Each item stops counting as unwritten once its answer is sent.
        for (waiter, _unwritten) in waiters {
            // A caller that stopped waiting has its item written all the same.
            let _ = waiter.send(
                answers
                    .next()
                    .unwrap_or_else(|| Err("the writer gave no answer for this item".into())),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;
    use std::time::Duration;

    /// A writer that records each go, holds it until `release` says so, and refuses the
    /// items named "bad".
    fn recording(
        goes: Arc<StdMutex<Vec<Vec<String>>>>,
        release: Arc<tokio::sync::Semaphore>,
    ) -> Writer<String> {
        Box::new(move |items: Vec<String>| {
            let (goes, release) = (goes.clone(), release.clone());
            Box::pin(async move {
                goes.lock().unwrap().push(items.clone());
                release.acquire().await.unwrap().forget();
                items
                    .iter()
                    .map(|i| {
                        if i == "bad" {
                            Err(format!("{i} refused"))
                        } else {
                            Ok(())
                        }
                    })
                    .collect()
            })
        })
    }

    #[tokio::test]
    async fn items_handed_in_while_a_go_is_in_flight_go_together_in_the_next() {
        let goes = Arc::new(StdMutex::new(Vec::new()));
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let commit = Arc::new(GroupCommit::<String>::default());
        assert!(!commit.busy());
        let write = |item: &str| {
            let (commit, goes, release, item) = (
                commit.clone(),
                goes.clone(),
                release.clone(),
                item.to_string(),
            );
            tokio::spawn(async move { commit.write(item, || recording(goes, release)).await })
        };
        let first = write("a");
        // The first go is in flight (held by the writer) before the others come.
        while goes.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(commit.busy());
        let later: Vec<_> = ["b", "bad", "c"].into_iter().map(write).collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        release.add_permits(2);
        assert_eq!(first.await.unwrap(), Ok(()));
        let answers: Vec<_> = futures_util::future::join_all(later)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            answers,
            vec![Ok(()), Err("bad refused".to_string()), Ok(())],
            "each caller gets its own item's answer"
        );
        assert_eq!(
            *goes.lock().unwrap(),
            vec![
                vec!["a".to_string()],
                vec!["b".into(), "bad".into(), "c".into()]
            ],
            "a quiet start writes at once; what came meanwhile is one go"
        );
        assert!(!commit.busy());
    }

    #[tokio::test]
    async fn a_caller_that_stops_waiting_still_has_its_item_written() {
        let goes = Arc::new(StdMutex::new(Vec::new()));
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let commit = GroupCommit::<String>::default();
        let gave_up = tokio::time::timeout(
            Duration::from_millis(20),
            commit.write("x".into(), || recording(goes.clone(), release.clone())),
        )
        .await;
        assert!(gave_up.is_err(), "the writer held the go");
        assert!(commit.busy(), "its item is still being written");
        release.add_permits(2);
        let next = commit
            .write("y".into(), || unreachable!("the task runs"))
            .await;
        assert_eq!(next, Ok(()));
        assert!(!commit.busy(), "both written");
        assert_eq!(
            *goes.lock().unwrap(),
            vec![vec!["x".to_string()], vec!["y".to_string()]]
        );
    }

    #[test]
    fn a_task_whose_runtime_ended_is_started_again_by_the_next_item() {
        let goes = Arc::new(StdMutex::new(Vec::new()));
        let release = Arc::new(tokio::sync::Semaphore::new(100));
        let commit = GroupCommit::<String>::default();
        for item in ["in the first runtime", "in the second"] {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let answer = runtime
                .block_on(commit.write(item.into(), || recording(goes.clone(), release.clone())));
            assert_eq!(answer, Ok(()), "{item}");
        }
        assert_eq!(goes.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_writer_that_answers_too_few_fails_the_rest_rather_than_leave_them_waiting() {
        let commit = GroupCommit::<u8>::default();
        let short: Writer<u8> = Box::new(|_items| Box::pin(async { Vec::new() }));
        let answer = commit.write(1, || short).await;
        assert_eq!(
            answer,
            Err("the writer gave no answer for this item".to_string())
        );
    }
}
