//! A run's write as the lifecycle asks for it ([`crate::store::SessionStore::save_run`]): what
//! [`crate::store::SessionStore::save`] writes, what the run knows of the record, and the
//! counters the write adds to in the same step — a model call's usage, counted against its
//! tenant by the write that follows the answer (the tenants' quotas name the counters).

use super::{Lease, SessionState, TurnRecord};

/// A run's write (see the module header).
#[derive(Debug, Clone, Copy)]
pub struct RunWrite<'a> {
    /// The session to write with the turn, if the run changed it.
    pub session: Option<&'a SessionState>,
    /// The turn's record.
    pub turn: &'a TurnRecord,
    /// The lease the write is checked against.
    pub lease: &'a Lease,
    /// The lease is given back in the same step.
    pub release: bool,
    /// The record is stored already (the run read it, or one of its writes succeeded): a store
    /// may skip asking whether it is new, which only a new record's first write needs (to list
    /// it among the session's turns).
    pub stored: bool,
    /// The store holds no conversation list for the session: it was not stored when the run
    /// began, and nothing the run wrote has listed any of its items. A write that gives the
    /// lease back may then keep the session's items with the session instead of starting a
    /// list (a session of one turn, the batch's shape, never gets one): they read back as the
    /// session's items ([`SessionState::conversation`]) and its next save lists them, ahead of
    /// its own. The whole conversation is always the list followed by those.
    pub unlisted: bool,
    /// Counters to add to in the same step, where the store can
    /// ([`crate::store::SessionStore::steps_reach_other_keys`]).
    pub counts: Option<&'a CounterAdds>,
}

/// Counters a write adds to: each made by the write gets `keep` as its expiry, one already
/// there keeps its own. A counter that cannot be added to (a key of another type) is reported,
/// never fails the write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterAdds {
    /// How long a counter the write makes is kept, in ms.
    pub keep_ms: u64,
    /// The additions, in order.
    pub adds: Vec<CounterAdd>,
}

/// One addition to a counter: a field of a hash (a tally's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterAdd {
    /// The counter's key (a hash).
    pub key: String,
    /// The hash field.
    pub field: String,
    /// The amount added.
    pub amount: u64,
}
