//! The live events a front door process saw recently, per turn, so that an SSE client that
//! reconnects with `Last-Event-ID` gets what it missed of the current turn's text. Small and
//! bounded: the last [`EVENTS_PER_TURN`] events of at most [`TURNS`] turns, and at most
//! [`MAX_BYTES`] of text in all (the oldest turn is forgotten first). A subscription that
//! ends keeps listening for [`LINGER`] (or until its turn settles) to fill it for the
//! client's return.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use crate::live::LiveEvent;

/// Events kept per turn.
pub const EVENTS_PER_TURN: usize = 512;
/// Turns kept.
pub const TURNS: usize = 1024;
/// Text kept in all (the events' text and messages), in bytes.
pub const MAX_BYTES: usize = 8 << 20;
/// How long a closed SSE subscription goes on filling the buffer.
pub const LINGER: Duration = Duration::from_secs(30);

type Key = (String, String);

/// Recent live events by (session, turn).
#[derive(Debug, Default)]
pub struct LiveBuffer {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    turns: HashMap<Key, VecDeque<LiveEvent>>,
    /// Turns in the order first seen, for forgetting the oldest.
    order: VecDeque<Key>,
    /// Bytes of text kept.
    bytes: usize,
}

fn size(event: &LiveEvent) -> usize {
    match &event.body {
        crate::live::LiveBody::Delta { text } => text.len(),
        crate::live::LiveBody::Progress { message } => message.len(),
    }
}

impl Inner {
    fn forget_oldest(&mut self) {
        if let Some(oldest) = self.order.pop_front()
            && let Some(events) = self.turns.remove(&oldest)
        {
            self.bytes -= events.iter().map(size).sum::<usize>();
        }
    }
}

impl LiveBuffer {
    /// Keeps `event` (an event already kept, by index, is not kept twice).
    pub fn record(&self, event: &LiveEvent) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let key = (event.session_id.clone(), event.turn_id.clone());
        if !inner.turns.contains_key(&key) {
            if inner.order.len() >= TURNS {
                inner.forget_oldest();
            }
            inner.order.push_back(key.clone());
        }
        let events = inner.turns.entry(key).or_default();
        if events.back().is_some_and(|e| e.index >= event.index) {
            return;
        }
        let mut freed = 0;
        if events.len() >= EVENTS_PER_TURN
            && let Some(dropped) = events.pop_front()
        {
            freed = size(&dropped);
        }
        events.push_back(event.clone());
        inner.bytes = inner.bytes - freed + size(event);
        // The turn being recorded is the newest: older ones go first, then its own oldest.
        while inner.bytes > MAX_BYTES && inner.order.len() > 1 {
            inner.forget_oldest();
        }
    }

    /// The kept events of a turn after `index`, in order.
    pub fn after(&self, session: &str, turn: &str, index: u64) -> Vec<LiveEvent> {
        self.inner
            .lock()
            .ok()
            .and_then(|inner| {
                inner
                    .turns
                    .get(&(session.to_string(), turn.to_string()))
                    .map(|events| events.iter().filter(|e| e.index > index).cloned().collect())
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::LiveBody;

    fn event(turn: &str, index: u64) -> LiveEvent {
        LiveEvent {
            session_id: "s".into(),
            turn_id: turn.into(),
            index,
            body: LiveBody::Delta {
                text: format!("{index}"),
            },
        }
    }

    #[test]
    fn keeps_what_came_after_an_index_once_and_within_bounds() {
        let b = LiveBuffer::default();
        for i in 0..3 {
            b.record(&event("t", i));
        }
        b.record(&event("t", 1)); // seen by two subscriptions: kept once
        let after: Vec<u64> = b.after("s", "t", 0).iter().map(|e| e.index).collect();
        assert_eq!(after, vec![1, 2]);
        assert!(b.after("s", "other", 0).is_empty());
        for i in 3..(EVENTS_PER_TURN as u64 + 10) {
            b.record(&event("t", i));
        }
        assert_eq!(b.after("s", "t", 0).len(), EVENTS_PER_TURN);
        for n in 0..TURNS + 1 {
            b.record(&event(&format!("x{n}"), 0));
        }
        assert!(
            b.after("s", "t", 0).is_empty(),
            "the oldest turn is forgotten"
        );
    }

    #[test]
    fn the_text_kept_in_all_is_bounded() {
        let b = LiveBuffer::default();
        let big = "x".repeat(64 << 10);
        let turns = 2 * MAX_BYTES / big.len();
        for n in 0..turns {
            b.record(&LiveEvent {
                session_id: "s".into(),
                turn_id: format!("t{n}"),
                index: 0,
                body: LiveBody::Delta { text: big.clone() },
            });
        }
        let inner = b.inner.lock().unwrap();
        assert!(inner.bytes <= MAX_BYTES, "{}", inner.bytes);
        let counted: usize = inner.turns.values().flatten().map(size).sum();
        assert_eq!(counted, inner.bytes);
        let newest = ("s".to_string(), format!("t{}", turns - 1));
        assert!(inner.turns.contains_key(&newest), "the newest turn is kept");
    }
}
