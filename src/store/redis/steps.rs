//! A run's two steps on the store: the begin step (the lease taken, the turn, the session
//! and what the run needs read under it) and the write that saves the turn (and settles it,
//! with the counters of the model call before it).
//! The scripts themselves are in `scripts.rs`.

use std::time::Duration;

use super::call::ScriptCall;
use super::codec::{decode, with_ledger};
use super::{RedisStore, lease_value, ms, unavailable};
use crate::contract::{SessionId, TurnId};
use crate::store::{
    Begun, ContextIds, Grant, Lease, RunWrite, Saved, SessionStore as _, StoreError,
};

/// About the most a session's items may take as JSON, in bytes, to stay with its record
/// (`RunWrite::unlisted`): a larger first turn starts the list at once, so the session's next
/// begin does not read and decode a large record only to list its items again.
const ITEMS_KEPT_WITH_SESSION: usize = 16 * 1024;

/// Takes about the bytes `value` takes as JSON (its strings, keys and a few bytes a value)
/// out of `left`; false once that runs out, or for a value nested deeper than an item ever is.
fn take_json_size(value: &serde_json::Value, left: &mut usize, depth: u8) -> bool {
    use serde_json::Value;
    if depth > 32 {
        return false;
    }
    let own = match value {
        Value::String(text) => text.len() + 2,
        Value::Object(members) => 2 + members.keys().map(|k| k.len() + 4).sum::<usize>(),
        Value::Array(values) => 2 + values.len(),
        _ => 8,
    };
    let Some(rest) = left.checked_sub(own) else {
        return false;
    };
    *left = rest;
    match value {
        Value::Object(members) => members.values().all(|v| take_json_size(v, left, depth + 1)),
        Value::Array(values) => values.iter().all(|v| take_json_size(v, left, depth + 1)),
        _ => true,
    }
}

/// Whether `items` may stay with the session's record ([`ITEMS_KEPT_WITH_SESSION`]).
fn small_enough(items: &[serde_json::Value]) -> bool {
    let mut left = ITEMS_KEPT_WITH_SESSION;
    !items.is_empty() && items.iter().all(|item| take_json_size(item, &mut left, 0))
}

/// What [`crate::store::SessionStore::begin_turn`] is asked.
pub(super) struct BeginStep<'a> {
    pub(super) session: &'a SessionId,
    pub(super) turn: &'a TurnId,
    pub(super) holder: &'a str,
    pub(super) ttl: Duration,
    pub(super) contexts: Option<&'a ContextIds>,
}

/// What the begin script answers: the fencing token (with the lease), the turn, its ledger,
/// the session, the latched contexts, the runs begun, whether a stop was asked, and whether
/// the probed key exists (1 or 0; -1 when none was named or the lease was not taken).
type BeginAnswer = (
    Option<u64>,
    Option<String>,
    std::collections::BTreeMap<String, String>,
    Option<String>,
    Option<String>,
    u32,
    i64,
    i64,
);

impl RedisStore {
    /// [`crate::store::SessionStore::begin_turn`]; with `probe` (a standalone server's key of
    /// any slot), whether that key exists, read in the same script once the lease is taken.
    pub(super) async fn begin_as(
        &self,
        grant: &Grant,
        step: BeginStep<'_>,
        probe: Option<&str>,
    ) -> Result<Begun, StoreError> {
        let BeginStep {
            session,
            turn,
            holder,
            ttl,
            contexts,
        } = step;
        let turn_key = self.turn_key("turn", session, turn);
        let (session_key, contexts_key) =
            (self.key("session", session), self.key("contexts", session));
        let mut call = ScriptCall::new(&self.scripts.begin, if probe.is_some() { 7 } else { 6 });
        call.key_joined(&self.key_parts("lease", session))
            .key(&turn_key)
            .key_joined(&self.turn_key_parts("ledger", session, turn))
            .key(&session_key)
            .key(&contexts_key)
            .key_joined(&self.turn_key_parts("cancel", session, turn));
        if let Some(key) = probe {
            call.key(key);
        }
        // The lease's value names the turn: its token counts the turn's runs, so two turns'
        // first runs share a token, and a holder that does not name its turn must not give
        // them one value.
        let holder = format!("{turn}/{holder}");
        call.arg(&holder)
            .arg(ms(ttl))
            .arg(ms(self.retention.turns_index()));
        match contexts {
            Some(c) => call.arg_json(c)?,
            None => call.arg(""),
        };
        call.arg(ms(self.retention.turns));
        let answer: BeginAnswer = call.invoke(&mut self.conn()).await.map_err(unavailable)?;
        let (token, raw_turn, ledger, raw_session, raw_latched, runs, stop, probed) = answer;
        let lease = token.map(|token| Lease { token, holder });
        let read = with_ledger(&turn_key, raw_turn, ledger).and_then(|turn| {
            Ok((
                turn,
                decode(&session_key, raw_session)?,
                decode(&contexts_key, raw_latched)?,
            ))
        });
        match read {
            Ok((turn, session, latched)) => Ok(Begun {
                turn: turn.map(Box::new),
                lease,
                session,
                latched,
                runs,
                stop_requested: stop == 1,
                probed: (probed >= 0).then_some(probed == 1),
            }),
            Err(e) => {
                // Nothing will run under a lease whose reads failed: give it back rather than
                // leave the session busy until it expires.
                if let Some(lease) = &lease {
                    let _ = self.release_lease(grant, session, lease).await;
                }
                Err(e)
            }
        }
    }

    /// [`crate::store::SessionStore::save_run`]: a write of a record known to be stored sends
    /// no turn id to list, so the script does not ask whether the record is new; counters go
    /// in as keys of their own (a cluster's script cannot reach them: there they are missed).
    pub(super) async fn save_as(&self, write: RunWrite<'_>) -> Result<Saved, StoreError> {
        let RunWrite {
            session,
            turn,
            lease,
            release,
            stored,
            unlisted,
            counts,
        } = write;
        // The run's last write of a session with no list keeps its items with it (see
        // `RunWrite::unlisted`), when they are small: no list to start, nor to keep as long as
        // the session.
        let inline = release && unlisted && session.is_some_and(|s| small_enough(&s.conversation));
        let counts = counts.filter(|c| !c.adds.is_empty());
        let (counts, missed) = match counts {
            Some(_) if !self.steps_reach_other_keys() => (None, true),
            counts => (counts, false),
        };
        let adds = counts.map_or(&[][..], |c| &c.adds);
        let sid = &turn.session_id;
        let tid = &turn.turn_id;
        // Room for the keys, a settled record, the session and a turn's conversation items.
        let mut call = ScriptCall::with_room(&self.scripts.save, 8 + adds.len(), 4096);
        call.key_joined(&self.key_parts("lease", sid))
            .key_joined(&self.turn_key_parts("turn", sid, tid))
            .key_joined(&self.key_parts("turns", sid))
            .key_joined(&self.key_parts("session", sid))
            .key_joined(&self.turn_key_parts("ledger", sid, tid))
            .key_joined(&self.key_parts("conversation", sid))
            .key_joined(&self.turn_key_parts("cancel", sid, tid))
            .key_joined(&self.key_parts("watched", sid));
        for add in adds {
            call.key(&add.key);
        }
        call.arg(lease_value(lease))
            .arg_json(turn)?
            .arg(ms(self.retention.turns))
            .arg(if release { "1" } else { "0" })
            .arg(if stored { "" } else { turn.turn_id.as_str() });
        match session {
            Some(s) if inline => call.arg_json_with(s, "conversation", &s.conversation)?,
            Some(s) => call.arg_json(s)?,
            None => call.arg(""),
        };
        call.arg(ms(self.retention.sessions))
            .arg(counts.map_or(0, |c| c.keep_ms))
            .arg(adds.len())
            .arg(if inline { "0" } else { "1" });
        for add in adds {
            call.arg(&add.field).arg(add.amount);
        }
        if !inline {
            for item in session.iter().flat_map(|s| &s.conversation) {
                call.arg_json(item)?;
            }
        }
        let result: Result<i64, _> = call.invoke(&mut self.conn()).await;
        result
            .map(|read| Saved {
                stop_requested: read & 1 == 1,
                watched: read & 2 == 2,
                counts_missed: missed || read & 4 == 4,
            })
            .map_err(|e| self.map_fenced(sid, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn items_stay_with_the_session_only_while_small_and_shallow() {
        let item = json!({"role": "user", "content": "hi"});
        let mut left = 1000;
        assert!(take_json_size(&item, &mut left, 0));
        let taken = 1000 - left;
        assert!(
            (10..=item.to_string().len() + 8).contains(&taken),
            "about its JSON: {taken}"
        );
        assert!(small_enough(std::slice::from_ref(&item)));
        assert!(!small_enough(&[]), "nothing to keep");
        let big = json!({"content": "x".repeat(ITEMS_KEPT_WITH_SESSION)});
        assert!(!small_enough(&[big]));
        let mut deep = json!(1);
        for _ in 0..40 {
            deep = json!([deep]);
        }
        assert!(!small_enough(&[deep]), "deeper than an item ever is");
    }
}
