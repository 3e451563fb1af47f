//! A model call's usage counted by the run's next write, in the write's own step, where the
//! store can add the quotas' counters (a standalone Redis holding both): one script for the
//! write and the count instead of two sent side by side. Otherwise the reasoner counts it apart,
//! beside the write (`Pipeline::counting`).
//!
//! Every call paid for is counted: a count the write did not make — fenced out (nothing
//! written), never sent (the run writes nothing more) — is made apart; one the store could not
//! make in its step (a key of another type) is logged. A write whose answer was lost may or
//! may not have counted: it is counted apart too (a quota is never overrun for want of a
//! count), and the warning says the call may be counted twice.

use super::{Lifecycle, Run};
use crate::store::{CounterAdds, StoreError};
use crate::tenants::Spent;

/// A call's usage riding on the run's next write: the counters to add, and the spending they
/// stand for (to count apart if the write does not).
pub(super) struct InWrite {
    pub(super) adds: CounterAdds,
    spent: Spent,
}

impl Lifecycle {
    /// Has the run's next write count `spent` in its own step, where it can (see the module
    /// header); otherwise gives it back, to be counted beside the write.
    pub(in crate::pipeline) fn count_in_write(&self, run: &mut Run, spent: Spent) -> Option<Spent> {
        if !self.counts_on_store || !self.store.steps_reach_other_keys() {
            return Some(spent);
        }
        let Some(adds) = (self.quotas).counts_in_write(&spent.tenant, &spent.context, spent.usage)
        else {
            return Some(spent);
        };
        debug_assert!(run.counts.is_none(), "one call's usage per write");
        run.counts = Some(InWrite { adds, spent });
        None
    }

    /// Counts apart what a write that was not made was to count.
    pub(super) async fn count_unwritten(&self, counts: Option<InWrite>) {
        if let Some(InWrite { spent, .. }) = counts {
            (self.quotas)
                .count_apart(&spent.tenant, &spent.context, spent.usage)
                .await;
        }
    }

    /// After a write failed with `error`: counts apart what it was to count — a write fenced
    /// out wrote nothing; one whose answer was lost may have counted already.
    pub(super) async fn count_after_failed_write(
        &self,
        counts: Option<InWrite>,
        error: &StoreError,
    ) {
        if let (Some(InWrite { spent, .. }), false) =
            (&counts, matches!(error, StoreError::Fenced(_)))
        {
            tracing::warn!(tenant = %spent.tenant, tokens = spent.usage.total_tokens, error = %error, "the write that was to count a model call's usage went unanswered; counting it apart (it may be counted twice)");
        }
        self.count_unwritten(counts).await;
    }

    /// Logs counters a write could not add to (see [`crate::store::Saved::counts_missed`]).
    pub(super) fn counts_missed(&self, counts: Option<&InWrite>) {
        if let Some(InWrite { spent, .. }) = counts {
            tracing::warn!(tenant = %spent.tenant, tokens = spent.usage.total_tokens, "cannot count the tenant's model usage in the turn's write (a counter key holds something else); its quotas may be overrun");
        }
    }
}
