//! The runs list (`GET /v1/turns`): the latest turns of one tenant or of several, newest
//! first, filtered and paged. It walks the runs index ([`crate::store::StoreReader::recent_turns`])
//! from a position, reads the records of each stretch in one request, keeps the lines that
//! pass the filters, and stops at a page's worth of lines or after [`SCAN_AT_MOST`] entries —
//! so a filter that matches little costs a bounded read, and the answer says where to go on.
//!
//! Owns: the filters, the walk and the page position's text form. Must not: write anything.

use crate::contract::{SessionId, TurnId};
use crate::state::{RunLine, TurnRecord, TurnStatus};
use crate::store::{IndexedTurn, RunsPage, RunsPosition, StoreError, StoreReader};

/// The most index entries one listing reads before it answers with what it found.
pub const SCAN_AT_MOST: usize = 2000;
/// Entries read (and records fetched) per stretch of the walk.
const STRETCH: usize = 100;

/// What a listing asks for.
#[derive(Debug, Clone, Default)]
pub struct RunsQuery {
    /// Whose turns (one tenant, or every tenant an admin may see).
    pub tenants: Vec<String>,
    /// Only turns in one of these statuses (any when empty).
    pub statuses: Vec<TurnStatus>,
    /// Only turns accepted at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Only turns accepted at or before this time.
    pub until_ms: Option<i64>,
    /// Only turns whose calls go to this agent context.
    pub agent_context: Option<String>,
    /// Only lines of this batch.
    pub batch: Option<String>,
    /// The turns of that batch (read from the batch's record by whoever asks): a batch's
    /// lines are known by their ids, whether or not their records name the batch.
    pub batch_turns: Option<std::collections::HashSet<(SessionId, TurnId)>>,
    /// Only turns whose session or turn id holds this text.
    pub search: Option<String>,
    /// At most this many lines.
    pub limit: usize,
    /// Go on after this position (the previous page's `next`).
    pub after: Option<RunsPosition>,
}

/// A page of the runs list.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunsListing {
    /// The turns found, newest first.
    pub turns: Vec<RunLine>,
    /// Where the next page starts (`?after=`); absent when the index has no more entries in
    /// range.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Index entries read for this page: a filter that matches little may answer fewer lines
    /// than asked, with a `next` to go on from.
    pub scanned: usize,
}

/// A position as the API writes it: `<ms>.<scoped session>/<turn>` (a turn id holds no `/`).
pub fn position_text(p: &RunsPosition) -> String {
    format!("{}.{}", p.at_ms, p.member.replacen(' ', "/", 1))
}

/// A position from its text ([`position_text`]); `None` if it is not one.
pub fn parse_position(text: &str) -> Option<RunsPosition> {
    let (ms, rest) = text.split_once('.')?;
    let (session, turn) = rest.rsplit_once('/')?;
    let at_ms = ms.parse::<i64>().ok()?;
    let entry = IndexedTurn {
        at_ms,
        session: SessionId::parse_scoped(session).ok()?,
        turn: TurnId::parse(turn).ok()?,
    };
    Some(entry.position())
}

impl RunsQuery {
    fn matches_ids(&self, e: &IndexedTurn) -> bool {
        let in_batch = self
            .batch_turns
            .as_ref()
            .is_none_or(|turns| turns.contains(&(e.session.clone(), e.turn.clone())));
        in_batch
            && self.search.as_deref().is_none_or(|q| {
                let q = q.to_ascii_lowercase();
                e.session.client_id().to_ascii_lowercase().contains(&q)
                    || e.turn.as_str().to_ascii_lowercase().contains(&q)
            })
    }

    fn matches_record(&self, r: &TurnRecord) -> bool {
        self.statuses.is_empty() || self.statuses.contains(&r.status)
    }
}

/// The next `max` entries after `after` across `tenants`' indexes, newest first.
async fn stretch(
    store: &dyn StoreReader,
    q: &RunsQuery,
    after: Option<RunsPosition>,
    max: usize,
) -> Result<Vec<IndexedTurn>, StoreError> {
    let page = RunsPage {
        after,
        since_ms: q.since_ms,
        until_ms: q.until_ms,
        max,
    };
    let mut all = Vec::new();
    for tenant in &q.tenants {
        all.extend(store.recent_turns(tenant, &page).await?);
    }
    all.sort_by_key(|e| std::cmp::Reverse(e.position()));
    all.truncate(max);
    Ok(all)
}

/// One page of the runs list.
pub async fn list(store: &dyn StoreReader, q: &RunsQuery) -> Result<RunsListing, StoreError> {
    let mut turns = Vec::new();
    let mut after = q.after.clone();
    let mut scanned = 0;
    while scanned < SCAN_AT_MOST {
        let entries = stretch(store, q, after.clone(), STRETCH.min(SCAN_AT_MOST - scanned)).await?;
        if entries.is_empty() {
            return Ok(RunsListing {
                turns,
                next: None,
                scanned,
            });
        }
        let wanted: Vec<&IndexedTurn> = entries.iter().filter(|e| q.matches_ids(e)).collect();
        let ids: Vec<(SessionId, TurnId)> = wanted
            .iter()
            .map(|e| (e.session.clone(), e.turn.clone()))
            .collect();
        let records = store.get_turns(&ids).await?;
        let mut found = std::collections::HashMap::new();
        for (e, r) in wanted.iter().zip(records) {
            if let Some(r) = r.filter(|r| q.matches_record(r)) {
                found.insert(e.position(), r);
            }
        }
        for e in &entries {
            scanned += 1;
            after = Some(e.position());
            let Some(record) = found.remove(&e.position()) else {
                continue;
            };
            let mut line = RunLine::of(&record, e.session.tenant());
            if line.batch_id.is_none() && q.batch_turns.is_some() {
                line.batch_id = q.batch.clone();
            }
            if line.agent_context.is_none() {
                line.agent_context = store
                    .latched_contexts(&e.session)
                    .await?
                    .map(|c| c.agent_context_id);
            }
            if q.agent_context
                .as_deref()
                .is_some_and(|c| line.agent_context.as_deref() != Some(c))
            {
                continue;
            }
            turns.push(line);
            if turns.len() == q.limit {
                return Ok(RunsListing {
                    turns,
                    next: after.as_ref().map(position_text),
                    scanned,
                });
            }
        }
    }
    Ok(RunsListing {
        turns,
        next: after.as_ref().map(position_text),
        scanned,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_reads_back_from_its_text() {
        let e = IndexedTurn {
            at_ms: 1_764_000_000_123,
            session: SessionId::parse("s.1").unwrap().within("acme"),
            turn: TurnId::parse("t-1").unwrap(),
        };
        let text = position_text(&e.position());
        assert_eq!(parse_position(&text), Some(e.position()), "{text}");
        for bad in ["", "12", "x.s/t", "12.s", "12.s t/u", "12.s/t u"] {
            assert_eq!(parse_position(bad), None, "{bad:?}");
        }
    }
}
