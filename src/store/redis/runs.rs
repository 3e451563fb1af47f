//! The runs index in Redis: one sorted set per tenant, `<ns>:runs:{<tenant>}`, each turn's
//! entry name scored by the millisecond it was accepted. A quiet front door notes a turn in
//! its admission's script; notes that have company (admissions that overlap) are written
//! together, each tenant's of a go with one `ZADD NX` ([`super::group_commit`]): what a
//! `ZADD` costs Redis is mostly its dispatch, which a go shares. Now and then (once a minute
//! per tenant and process) a note's round trip also drops the entries older than the turn
//! retention and keeps the set that long, so an index never outgrows the records it names.

use std::time::Duration;

use super::group_commit::{Answers, Writer};
use super::{RedisStore, ms, unavailable};
use crate::store::{IndexedTurn, Noting, RunsPage, StoreError, now_ms};

/// How often a process trims a tenant's index.
const TRIM_EVERY: Duration = Duration::from_secs(60);
/// Tenants whose last trim a process remembers; past that, the memory is dropped whole (each
/// tenant is then trimmed once more, which costs one command).
const TRIMS_REMEMBERED: usize = 4096;
/// The most entries one read asks for.
const READ_AT_MOST: usize = 1000;

impl RedisStore {
    pub(super) fn runs_key(&self, tenant: &str) -> String {
        self.runs_key_parts(tenant).concat()
    }

    /// The parts [`RedisStore::runs_key`] joins.
    pub(super) fn runs_key_parts<'a>(&'a self, tenant: &'a str) -> [&'a str; 4] {
        [self.namespace.as_str(), ":runs:{", tenant, "}"]
    }

    /// The score of the oldest entry a trim keeps: those of turns the retention still keeps.
    pub(super) fn oldest_run_kept(&self) -> i64 {
        now_ms().saturating_sub(ms(self.retention.turns) as i64)
    }

    /// Forgets that `tenant`'s index was trimmed: the request that was to trim it failed.
    pub(super) fn trim_missed(&self, tenant: &str) {
        if let Ok(mut trimmed) = self.runs_trimmed.lock() {
            trimmed.remove(tenant);
        }
    }

    /// Whether this process should trim `tenant`'s index with the note of a turn accepted at
    /// `now_ms` (and, if so, notes that it did). The note's own time serves as the clock: no
    /// second read of it; a clock set back makes the next note trim.
    pub(super) fn trim_due(&self, tenant: &str, now_ms: i64) -> bool {
        let Ok(mut trimmed) = self.runs_trimmed.lock() else {
            return true;
        };
        let every = ms(TRIM_EVERY) as i64;
        let due = trimmed
            .get(tenant)
            .is_none_or(|at| now_ms < *at || now_ms - *at >= every);
        if due {
            if trimmed.len() >= TRIMS_REMEMBERED {
                trimmed.clear();
            }
            trimmed.insert(tenant.to_string(), now_ms);
        }
        due
    }

    /// [`crate::store::RecordWriter::index_turn`]: the note joins the process's next go of
    /// notes ([`super::group_commit`]), which writes each tenant's with one `ZADD`, and the
    /// answer is that go's for its tenant.
    pub(super) fn note_run(&self, entry: IndexedTurn) -> Noting {
        let answer = self.runs_notes.hand_in(entry, || self.runs_writer());
        Box::pin(async move { answer.wait().await.map_err(StoreError::Unavailable) })
    }

    /// Whether a note now would have company: notes are being written, or another admission
    /// is under way in this process. The admission then leaves its note to the next go
    /// rather than make it in its own script ([`crate::store::SessionStore::admit_and_index`]).
    pub(super) fn notes_have_company(&self, other_admissions: usize) -> bool {
        other_admissions > 0 || self.runs_notes.busy()
    }

    /// The writer of the process's notes: a copy of this store with a group commit of its own
    /// (never used), so the task does not keep itself alive.
    fn runs_writer(&self) -> Writer<IndexedTurn> {
        let store = Self {
            runs_notes: Default::default(),
            ..self.clone()
        };
        Box::new(move |notes| {
            let store = store.clone();
            Box::pin(async move { store.write_notes(notes).await })
        })
    }

    /// One go of notes: each tenant's in one `ZADD NX` (with the trim when one is due), the
    /// tenants' side by side; an answer for each note, its tenant's.
    async fn write_notes(&self, notes: Vec<IndexedTurn>) -> Answers {
        // Each note's tenant by its place among the go's tenants (a go may hold many).
        let mut place = foldhash::HashMap::<&str, usize>::default();
        let mut tenants: Vec<(&str, Vec<&IndexedTurn>)> = Vec::new();
        let mut of_note = Vec::with_capacity(notes.len());
        for entry in &notes {
            let tenant = entry.session.tenant();
            let at = *place.entry(tenant).or_insert_with(|| {
                tenants.push((tenant, Vec::new()));
                tenants.len() - 1
            });
            tenants[at].1.push(entry);
            of_note.push(at);
        }
        let written: Vec<Result<(), String>> = futures_util::future::join_all(
            tenants
                .iter()
                .map(|(tenant, entries)| self.note_runs(tenant, entries)),
        )
        .await
        .into_iter()
        .map(|w| w.map_err(|e| e.to_string()))
        .collect();
        of_note.into_iter().map(|at| written[at].clone()).collect()
    }

    /// Notes `entries` in `tenant`'s index: one `ZADD NX`, the trim before it (and the
    /// index's expiry after it) when one is due.
    async fn note_runs(&self, tenant: &str, entries: &[&IndexedTurn]) -> Result<(), StoreError> {
        let key = self.runs_key(tenant);
        let newest = entries.iter().map(|e| e.at_ms).max().unwrap_or_else(now_ms);
        let mut pipe = redis::pipe();
        let trim = self.trim_due(tenant, newest);
        if trim {
            let oldest = self.oldest_run_kept();
            pipe.cmd("ZREMRANGEBYSCORE")
                .arg(&key)
                .arg("-inf")
                .arg(format!("({oldest}"))
                .ignore();
        }
        let add = pipe.cmd("ZADD").arg(&key).arg("NX");
        for entry in entries {
            add.arg(entry.at_ms).arg(entry.member());
        }
        add.ignore();
        if trim {
            pipe.cmd("PEXPIRE")
                .arg(&key)
                .arg(ms(self.retention.turns))
                .ignore();
        }
        let written: Result<(), _> = pipe.query_async(&mut self.conn()).await;
        if let Err(e) = written {
            if trim {
                self.trim_missed(tenant);
            }
            return Err(unavailable(e));
        }
        Ok(())
    }

    /// [`crate::store::StoreReader::recent_turns`]: `ZREVRANGEBYSCORE` from the page's upper
    /// bound, again further on only when entries of the previous page's last millisecond
    /// filled a read.
    pub(super) async fn read_runs(
        &self,
        tenant: &str,
        page: &RunsPage,
    ) -> Result<Vec<IndexedTurn>, StoreError> {
        let mut out = Vec::new();
        if page.max == 0 {
            return Ok(out);
        }
        let key = self.runs_key(tenant);
        let oldest = self.oldest_run_kept();
        let low = page.since_ms.map_or(oldest, |s| s.max(oldest));
        let high = [page.until_ms, page.after.as_ref().map(|p| p.at_ms)]
            .into_iter()
            .flatten()
            .min()
            .map_or_else(|| "+inf".to_string(), |h| h.to_string());
        let chunk = (page.max + 16).min(READ_AT_MOST);
        let mut offset = 0;
        loop {
            let got: Vec<(String, f64)> = redis::cmd("ZREVRANGEBYSCORE")
                .arg(&key)
                .arg(&high)
                .arg(low)
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(offset)
                .arg(chunk)
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            let read = got.len();
            for (member, score) in got {
                let at = score as i64;
                if !page.admits(at, &member) {
                    continue;
                }
                match IndexedTurn::from_member(at, &member) {
                    Some(entry) => out.push(entry),
                    None => tracing::warn!(
                        key,
                        member,
                        "a runs index entry that names no turn; skipped"
                    ),
                }
                if out.len() == page.max {
                    return Ok(out);
                }
            }
            if read < chunk {
                return Ok(out);
            }
            offset += read;
        }
    }
}
