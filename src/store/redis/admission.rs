//! A new turn's admission at the front door: the session's owner claimed and its contexts
//! latched (each set once, then kept as long as the session), and the one script that claims,
//! latches and records a queued turn in one round trip.

use super::codec::{decode, encode, runs_begun};
use super::{RedisStore, ms, unavailable};
use crate::store::{Admission, ContextIds, StoreError, TurnRecord};

impl RedisStore {
    /// Sets a session-lived `key` to `value` unless it holds one already, keeps it as long as
    /// the session, and returns what it holds (one round trip, two commands: `SET NX GET PX`
    /// answers what the key held, if anything, and `PEXPIRE` keeps one already set).
    pub(super) async fn set_once(&self, key: &str, value: &str) -> Result<String, StoreError> {
        let ttl = ms(self.retention.sessions);
        let (held, _): (Option<String>, i64) = redis::pipe()
            .cmd("SET")
            .arg(key)
            .arg(value)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(ttl)
            .cmd("PEXPIRE")
            .arg(key)
            .arg(ttl)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(held.unwrap_or_else(|| value.to_string()))
    }

    /// [`crate::store::SessionStore::admit_turn`] in one script (`ADMIT_TURN`); without an
    /// owner and contexts, [`crate::store::SessionStore::create_turn`].
    pub(super) async fn admit(
        &self,
        owner: Option<&str>,
        contexts: Option<&ContextIds>,
        turn: &TurnRecord,
    ) -> Result<Admission, StoreError> {
        let (session, key) = (
            &turn.session_id,
            self.turn_key("turn", &turn.session_id, &turn.turn_id),
        );
        let contexts_key = self.key("contexts", session);
        let (step, found, runs): (i64, Option<String>, Option<String>) = self
            .scripts
            .admit_turn
            .key(self.key("owner", session))
            .key(&contexts_key)
            .key(&key)
            .key(self.key("turns", session))
            .key(self.turn_key("ledger", session, &turn.turn_id))
            .arg(owner.unwrap_or(""))
            .arg(match contexts {
                Some(c) => encode(c)?,
                None => String::new(),
            })
            .arg(encode(turn)?)
            .arg(ms(self.retention.turns))
            .arg(turn.turn_id.as_str())
            .arg(ms(self.retention.sessions))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        match step {
            0 => Ok(Admission::OtherOwner),
            1 => decode(&contexts_key, found)?
                .map(Admission::OtherContexts)
                .ok_or_else(|| StoreError::Corrupt(format!("{contexts_key}: no contexts latched"))),
            2 | 3 => {
                let mut existing: Option<TurnRecord> = decode(&key, found)?;
                if let (Some(record), Some(runs)) = (existing.as_mut(), runs) {
                    record.with_runs_begun(runs_begun(&key, &runs)?);
                }
                Ok(Admission::Turn(existing.map(Box::new)))
            }
            other => Err(StoreError::Corrupt(format!(
                "{key}: the admission script answered step {other}"
            ))),
        }
    }
}
