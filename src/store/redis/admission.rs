//! A new turn's admission at the front door: the session's owner claimed and its contexts
//! latched (each set once, then kept as long as the session), and the one script that claims,
//! latches and records a queued turn in one round trip.

use super::call::ScriptCall;
use super::codec::{decode, runs_begun};
use super::{RedisStore, ms, unavailable};
use crate::store::{Admission, ContextIds, IndexedTurn, StoreError, TurnRecord};

/// What `ADMIT_TURN` answers: its step, the record or latch it found, the runs begun of a
/// found turn, and why its runs index note failed.
type AdmitAnswer = (i64, Option<String>, Option<String>, Option<String>);

impl RedisStore {
    /// Sets a session-lived `key` to `value` unless it holds one already, keeps it as long as
    /// the session's turns index ([`crate::store::Retention::turns_index`]), and returns what
    /// it holds (one round trip, two commands: `SET NX GET PX` answers what the key held, if
    /// anything, and `PEXPIRE` keeps one already set).
    pub(super) async fn set_once(&self, key: &str, value: &str) -> Result<String, StoreError> {
        let ttl = ms(self.retention.turns_index());
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
    /// owner and contexts, [`crate::store::SessionStore::create_turn`]. With `run` (when it
    /// was accepted), a turn the script records or finds is noted in its tenant's runs index
    /// by the same script
    /// ([`crate::store::SessionStore::admit_and_index`]; a standalone server's scripts may
    /// touch keys of any slot). Answers, beside the admission, why that note failed, if it
    /// did.
    pub(super) async fn admit(
        &self,
        owner: Option<&str>,
        contexts: Option<&ContextIds>,
        turn: &TurnRecord,
        run: Option<i64>,
    ) -> Result<(Admission, Option<String>), StoreError> {
        let (session, key) = (
            &turn.session_id,
            self.turn_key("turn", &turn.session_id, &turn.turn_id),
        );
        let contexts_key = self.key("contexts", session);
        let tenant = session.tenant();
        // Room for the keys and a queued record.
        let mut script = ScriptCall::with_room(
            &self.scripts.admit_turn,
            if run.is_some() { 6 } else { 5 },
            2048,
        );
        script
            .key_joined(&self.key_parts("owner", session))
            .key(&contexts_key)
            .key(&key)
            .key_joined(&self.key_parts("turns", session))
            .key_joined(&self.turn_key_parts("ledger", session, &turn.turn_id));
        if run.is_some() {
            script.key_joined(&self.runs_key_parts(tenant));
        }
        script.arg(owner.unwrap_or(""));
        match contexts {
            Some(c) => script.arg_json(c)?,
            None => script.arg(""),
        };
        script
            .arg_json(turn)?
            .arg(ms(self.retention.turns))
            .arg(turn.turn_id.as_str())
            .arg(ms(self.retention.turns_index()));
        // Whether this note trims is decided last: a trim counted as done must be sent.
        let mut trims = false;
        if let Some(at_ms) = run {
            script
                .arg(at_ms)
                .arg_joined(&IndexedTurn::member_parts(session, &turn.turn_id));
            trims = self.trim_due(tenant, at_ms);
            if trims {
                script.arg(self.oldest_run_kept());
            } else {
                script.arg("");
            }
        }
        let answer: Result<AdmitAnswer, _> = script.invoke(&mut self.conn()).await;
        let (step, found, runs, missed) = match answer {
            Ok(answer) => answer,
            Err(e) => {
                if trims {
                    self.trim_missed(tenant);
                }
                return Err(unavailable(e));
            }
        };
        let admission = match step {
            0 => Admission::OtherOwner,
            1 => decode(&contexts_key, found)?
                .map(Admission::OtherContexts)
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("{contexts_key}: no contexts latched"))
                })?,
            2 | 3 => {
                let mut existing: Option<TurnRecord> = decode(&key, found)?;
                if let (Some(record), Some(runs)) = (existing.as_mut(), runs) {
                    record.with_runs_begun(runs_begun(&key, &runs)?);
                }
                Admission::Turn(existing.map(Box::new))
            }
            other => {
                return Err(StoreError::Corrupt(format!(
                    "{key}: the admission script answered step {other}"
                )));
            }
        };
        Ok((admission, missed))
    }
}
