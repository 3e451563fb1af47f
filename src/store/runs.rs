//! The runs index: each tenant's turns by when they were accepted, newest first — what the
//! lists a person starts from read (`GET /v1/turns`, the console's home page). An entry only
//! names a turn; its record holds the rest, and an entry whose record is gone (expired, or
//! taken back because its job was never accepted) is skipped by whoever reads it.
//!
//! Owns: the entry, its place in the order, and a page of entries. Must not: hold a turn's
//! state (the index is a view: losing an entry loses no turn).

use crate::contract::{SessionId, TurnId};

/// One turn in the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedTurn {
    /// When the front door accepted the turn (milliseconds since the Unix epoch).
    pub at_ms: i64,
    /// The session (scoped to its tenant).
    pub session: SessionId,
    /// The turn.
    pub turn: TurnId,
}

impl IndexedTurn {
    /// An entry for a turn accepted at `at_ms`.
    pub fn of(at_ms: i64, session: &SessionId, turn: &TurnId) -> Self {
        Self {
            at_ms,
            session: session.clone(),
            turn: turn.clone(),
        }
    }

    /// The entry's name within its tenant's index: the scoped session id and the turn id,
    /// a space between (an id cannot hold one). Entries of one millisecond sort by it.
    pub fn member(&self) -> String {
        Self::member_parts(&self.session, &self.turn).concat()
    }

    /// The parts of [`IndexedTurn::member`]'s name for `session`'s `turn`, for a writer that
    /// writes them one after another without making the name first.
    pub fn member_parts<'a>(session: &'a SessionId, turn: &'a TurnId) -> [&'a str; 3] {
        [session.as_str(), " ", turn.as_str()]
    }

    /// The entry a stored name and time stand for; `None` for a name that is not one
    /// ([`IndexedTurn::member`]).
    pub fn from_member(at_ms: i64, member: &str) -> Option<Self> {
        let (session, turn) = member.split_once(' ')?;
        Some(Self {
            at_ms,
            session: SessionId::parse_scoped(session).ok()?,
            turn: TurnId::parse(turn).ok()?,
        })
    }

    /// Where the entry stands in the index's order (newest first; ties by name, last first):
    /// the position a page that ends with it continues from.
    pub fn position(&self) -> RunsPosition {
        RunsPosition {
            at_ms: self.at_ms,
            member: self.member(),
        }
    }
}

/// A place in a tenant's index: a page continues with the entries after it (older, or as old
/// and named before it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunsPosition {
    /// The entry's time.
    pub at_ms: i64,
    /// The entry's name ([`IndexedTurn::member`]).
    pub member: String,
}

impl RunsPosition {
    /// Whether an entry at `at_ms` named `member` comes after this place in the index's
    /// order (newest first).
    pub fn is_before(&self, at_ms: i64, member: &str) -> bool {
        (at_ms, member) < (self.at_ms, self.member.as_str())
    }
}

/// Which entries of a tenant's index to read.
#[derive(Debug, Clone, Default)]
pub struct RunsPage {
    /// Only entries after this place (the previous page's last).
    pub after: Option<RunsPosition>,
    /// Only entries at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Only entries at or before this time.
    pub until_ms: Option<i64>,
    /// At most this many.
    pub max: usize,
}

impl RunsPage {
    /// Whether an entry belongs on this page (its bounds; not its size).
    pub fn admits(&self, at_ms: i64, member: &str) -> bool {
        self.after
            .as_ref()
            .is_none_or(|p| p.is_before(at_ms, member))
            && self.since_ms.is_none_or(|s| at_ms >= s)
            && self.until_ms.is_none_or(|u| at_ms <= u)
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at_ms: i64, session: &str, turn: &str) -> IndexedTurn {
        IndexedTurn {
            at_ms,
            session: SessionId::parse(session).unwrap().within("acme"),
            turn: TurnId::parse(turn).unwrap(),
        }
    }

    #[test]
    fn a_member_reads_back_as_its_entry() {
        let e = entry(17, "s-1", "t:1");
        assert_eq!(IndexedTurn::from_member(17, &e.member()), Some(e));
        assert_eq!(IndexedTurn::from_member(1, "no-space"), None);
        assert_eq!(
            IndexedTurn::from_member(1, "s t u"),
            None,
            "a turn id has no space"
        );
    }

    #[test]
    fn a_page_continues_strictly_after_its_position() {
        let last = entry(100, "s", "b").position();
        let page = RunsPage {
            after: Some(last),
            ..RunsPage::default()
        };
        assert!(!page.admits(100, &entry(100, "s", "b").member()), "itself");
        assert!(
            !page.admits(100, &entry(100, "s", "c").member()),
            "named after it, same ms"
        );
        assert!(
            page.admits(100, &entry(100, "s", "a").member()),
            "named before it, same ms"
        );
        assert!(page.admits(99, &entry(99, "s", "z").member()), "older");
        assert!(!page.admits(101, &entry(101, "s", "a").member()), "newer");
    }

    #[test]
    fn a_page_keeps_to_its_time_range() {
        let page = RunsPage {
            since_ms: Some(10),
            until_ms: Some(20),
            ..RunsPage::default()
        };
        assert!(page.admits(10, "x") && page.admits(20, "x"));
        assert!(!page.admits(9, "x") && !page.admits(21, "x"));
    }
}
