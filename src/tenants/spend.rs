//! What a model call spent, counted against its tenant: its tokens (and estimated cost) against
//! the daily quotas, and every kind of token in the day's tally by agent context. Counted
//! apart ([`Quotas::spend`]), or as counters the run's next write adds to in its own step
//! ([`Quotas::counts_in_write`]) where the limits live on the session store's server.
//!
//! A count that cannot be written is logged, not fatal: the call was made and its answer is
//! good.

use super::{KEEP_COUNT, Quotas, cost_key, count_day, key};
use crate::contract::Usage;
use crate::store::{CounterAdd, CounterAdds};

/// What a model call spent, not yet counted against its tenant: the run's write that follows
/// the answer counts it in its own step where it can, else it is counted beside that write
/// ([`Quotas::spend`]); dropped, it is never counted.
#[derive(Debug)]
pub struct Spent {
    /// The tenant whose turn made the call.
    pub tenant: String,
    /// The agent context whose server answered.
    pub context: String,
    /// What the call spent.
    pub usage: Usage,
}

/// Whether a call spent nothing worth counting.
fn nothing(usage: &Usage) -> bool {
    usage.total_tokens == 0 && usage.cost_micros == 0
}

/// The tally's fields a call adds to, under its agent context: those above 0.
fn tally(context: &str, usage: &Usage) -> Vec<(String, u64)> {
    [
        ("calls", 1),
        ("input", usage.prompt_tokens),
        ("cached_input", usage.cached_tokens),
        ("output", usage.completion_tokens),
        ("reasoning", usage.reasoning_tokens),
        ("total", usage.total_tokens),
        ("cost_micros", usage.cost_micros),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(field, n)| {
        let mut name = String::with_capacity(context.len() + 1 + field.len());
        name.push_str(context);
        name.push('/');
        name.push_str(field);
        (name, n)
    })
    .collect()
}

impl Quotas {
    /// Counts what a model call of `tenant`'s turn on agent context `context` spent (see the
    /// module header), in steps of its own.
    pub async fn spend(&self, tenant: &str, context: &str, usage: Usage) {
        if nothing(&usage) {
            return;
        }
        self.metrics
            .tenant_spent(self.label(tenant), usage.total_tokens);
        self.count_apart(tenant, context, usage).await;
    }

    /// [`Quotas::spend`] for a call whose spending is in the metrics already: what a write
    /// was to count ([`Quotas::counts_in_write`]) but did not.
    pub async fn count_apart(&self, tenant: &str, context: &str, usage: Usage) {
        if nothing(&usage) {
            return;
        }
        let tokens = usage.total_tokens;
        let day = count_day();
        let counts = tally(context, &usage);
        let (k, cost) = (key(tenant), cost_key(tenant));
        let counted = self.store.add_usage(&k, &day, tokens, &counts, KEEP_COUNT);
        let priced = async {
            match usage.cost_micros {
                0 => Ok(()),
                n => self
                    .store
                    .add_tokens(&cost, &day, n, KEEP_COUNT)
                    .await
                    .map(drop),
            }
        };
        let (counted, priced) = tokio::join!(counted, priced);
        if let Err(e) = counted.and(priced) {
            tracing::warn!(%tenant, tokens, error = %e, "cannot count the tenant's model usage; its quotas may be overrun");
        }
    }

    /// What a model call spent, as the counters [`Quotas::spend`] would add to, for a write on
    /// the limit store's own server that adds to them in its own step (an empty set when the
    /// call spent nothing). `None` when the limit store has no such counters: count with
    /// [`Quotas::spend`]. The spending goes into the metrics now.
    pub fn counts_in_write(
        &self,
        tenant: &str,
        context: &str,
        usage: Usage,
    ) -> Option<CounterAdds> {
        let keep_ms = u64::try_from(KEEP_COUNT.as_millis()).unwrap_or(u64::MAX);
        if nothing(&usage) {
            return Some(CounterAdds {
                keep_ms,
                adds: Vec::new(),
            });
        }
        let day = count_day();
        let (count, tally_key) = self.store.day_keys(&key(tenant), &day)?;
        let cost = match usage.cost_micros {
            0 => None,
            n => Some((self.store.day_keys(&cost_key(tenant), &day)?.0, n)),
        };
        self.metrics
            .tenant_spent(self.label(tenant), usage.total_tokens);
        let mut adds = vec![CounterAdd {
            key: count,
            field: None,
            amount: usage.total_tokens,
        }];
        adds.extend(
            tally(context, &usage)
                .into_iter()
                .map(|(field, amount)| CounterAdd {
                    key: tally_key.clone(),
                    field: Some(field),
                    amount,
                }),
        );
        adds.extend(cost.map(|(key, amount)| CounterAdd {
            key,
            field: None,
            amount,
        }));
        Some(CounterAdds { keep_ms, adds })
    }
}
