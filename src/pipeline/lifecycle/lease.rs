//! The session's lease while a run holds it: renewed in the background, given back by the run
//! or by the store step that settles the turn.

use std::sync::Arc;

use tracing::warn;

use super::GRANT;
use crate::contract::SessionId;
use crate::store::{Lease, SessionStore};

/// The session's lease while a run holds it: renewed in the background until the run gives it
/// back — explicitly ([`HeldLease::release`]) or in the store's write that settles the turn
/// ([`HeldLease::released_by_store`]). A run that is abandoned without either (its task
/// cancelled, its process gone) stops renewing and leaves the lease to expire after its TTL, as
/// a crashed worker would: no write of the abandoned run can land after that (fencing).
pub(crate) struct HeldLease {
    pub(super) lease: Lease,
    pub(super) session: SessionId,
    pub(super) store: Arc<dyn SessionStore>,
    pub(super) renewer: tokio::task::JoinHandle<()>,
    pub(super) given_back: bool,
}

impl HeldLease {
    /// The lease, for the writes made under it.
    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Gives the lease back now if the run still holds it (a compare-and-delete on its own
    /// token: a no-op when a step already released it or another run took it over); a store
    /// that cannot be reached lets it expire instead.
    pub(crate) async fn release(mut self) {
        self.given_back = true;
        self.renewer.abort();
        if let Err(e) = self
            .store
            .release_lease(&GRANT, &self.session, &self.lease)
            .await
        {
            warn!(session_id = %self.session, error = %e, "could not give the session lease back; it expires on its own");
        }
    }

    /// The store released the lease in the write that settled the turn.
    pub(super) fn released_by_store(&mut self) {
        self.given_back = true;
        self.renewer.abort();
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.renewer.abort();
        if !self.given_back {
            tracing::debug!(session_id = %self.session, "run abandoned; its session lease expires on its own");
        }
    }
}
