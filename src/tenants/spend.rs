//! What a model call spent, counted against its tenant: every kind of token and the estimated
//! cost in the day's tally by agent context, which is also what the daily quotas read (one
//! record of the day's spending: no count of its own to agree with it). Counted apart
//! ([`Quotas::spend`]), or as counters the run's next write adds to in its own step
//! ([`Quotas::counts_in_write`]) where the limits live on the session store's server.
//!
//! A count that cannot be written is logged, not fatal: the call was made and its answer is
//! good.

use super::{KEEP_COUNT, Quotas, count_day, key};
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

/// The tally's fields a call adds to, under its agent context: those above 0. A call's total
/// is its input and output (what the Responses API and the gateways report), so the tally
/// keeps no total of its own: only what a model reported beyond those two, were it to
/// (`more_total`; the reader adds it, [`super::by_context`]). One command fewer on every write
/// that counts a call.
fn tally(context: &str, usage: &Usage) -> Vec<(String, u64)> {
    let more_total = usage
        .total_tokens
        .saturating_sub(usage.prompt_tokens.saturating_add(usage.completion_tokens));
    [
        ("calls", 1),
        ("input", usage.prompt_tokens),
        ("cached_input", usage.cached_tokens),
        ("output", usage.completion_tokens),
        ("reasoning", usage.reasoning_tokens),
        ("more_total", more_total),
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
        let counts = tally(context, &usage);
        let counted = self
            .store
            .add_tally(&key(tenant), &count_day(), &counts, KEEP_COUNT)
            .await;
        if let Err(e) = counted {
            tracing::warn!(%tenant, tokens = usage.total_tokens, error = %e, "cannot count the tenant's model usage; its quotas may be overrun");
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
        let tally_key = self.store.tally_key(&key(tenant), &count_day())?;
        self.metrics
            .tenant_spent(self.label(tenant), usage.total_tokens);
        let adds = tally(context, &usage)
            .into_iter()
            .map(|(field, amount)| CounterAdd {
                key: tally_key.clone(),
                field,
                amount,
            })
            .collect();
        Some(CounterAdds { keep_ms, adds })
    }
}

#[cfg(test)]
mod tests {
    use super::super::usage::by_context;
    use super::*;

    fn usage(input: u64, output: u64, total: u64) -> Usage {
        Usage {
            prompt_tokens: input,
            completion_tokens: output,
            total_tokens: total,
            ..Usage::default()
        }
    }

    #[test]
    fn a_calls_total_is_its_input_and_output_and_the_tally_keeps_only_what_is_beyond() {
        let fields = |u: &Usage| {
            tally("c", u)
                .into_iter()
                .map(|(f, _)| f)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            fields(&usage(10, 5, 15)),
            ["c/calls", "c/input", "c/output"]
        );
        assert_eq!(
            tally("c", &usage(10, 5, 18)).last(),
            Some(&("c/more_total".to_string(), 3))
        );
        // Tallied over two calls, the day reads back whole.
        let mut day = std::collections::BTreeMap::new();
        for u in [usage(10, 5, 15), usage(10, 5, 18)] {
            for (field, n) in tally("c", &u) {
                *day.entry(field).or_insert(0) += n;
            }
        }
        let read = &by_context(day)["c"];
        assert_eq!(
            (
                read.calls,
                read.input_tokens,
                read.output_tokens,
                read.total_tokens
            ),
            (2, 20, 10, 33)
        );
    }

    #[test]
    fn a_day_an_earlier_version_tallied_keeps_its_total() {
        let day = |fields: &[(&str, u64)]| {
            by_context(fields.iter().map(|(f, n)| (format!("c/{f}"), *n)).collect())["c"]
                .total_tokens
        };
        // A total of its own beyond input and output (a model that reported more).
        assert_eq!(day(&[("input", 10), ("output", 5), ("total", 17)]), 17);
        // The day of an upgrade: the earlier version's total holds only its own calls.
        assert_eq!(day(&[("input", 30), ("output", 15), ("total", 15)]), 45);
    }
}
