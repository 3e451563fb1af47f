//! What a tenant spent on a day, read back: the day's tally by agent context, the tokens and
//! cost summed over it (what the daily quotas hold against), and what `GET /v1/tenant/usage`
//! shows. Written by [`super::spend`].

use serde::Serialize;

use super::{Quotas, cost_key, key, today};
use crate::limiter::LimitStoreError;

/// What `GET /v1/tenant/usage` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantUsage {
    /// The tenant.
    pub tenant: String,
    /// The UTC day counted, `YYYY-MM-DD`.
    pub day: String,
    /// Model tokens (input + output) the tenant's turns spent that day.
    pub tokens_used: u64,
    /// The daily token quota, if the tenant has one.
    pub tokens_per_day: Option<u64>,
    /// When the day's count starts again from zero (RFC 3339, midnight UTC).
    pub resets_at: String,
    /// Turns running now across every worker, counted for tenants with `maxRunningTurns`
    /// only (`null` otherwise).
    pub running_turns: Option<u32>,
    /// The cap on running turns, if the tenant has one.
    pub max_running_turns: Option<u32>,
    /// The day's estimated cost in US dollars, at the agent contexts' prices (absent when
    /// nothing priced was spent).
    #[serde(
        rename = "estimatedCostUsd",
        skip_serializing_if = "is_zero",
        default,
        with = "crate::contract::response::usd"
    )]
    #[schema(value_type = Option<f64>)]
    pub cost_micros: u64,
    /// The daily cost quota in US dollars, if the tenant has one.
    #[serde(
        rename = "costPerDayUsd",
        skip_serializing_if = "Option::is_none",
        default,
        with = "usd_option"
    )]
    #[schema(value_type = Option<f64>)]
    pub cost_per_day_micros: Option<u64>,
    /// The day's model calls and tokens by agent context.
    pub by_agent_context: std::collections::BTreeMap<String, ContextUsage>,
}

/// One agent context's share of a tenant's day ([`TenantUsage::by_agent_context`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextUsage {
    /// Model calls answered.
    pub calls: u64,
    /// Input tokens.
    pub input_tokens: u64,
    /// Of the input tokens, those read from the prompt cache.
    pub cached_input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Of the output tokens, those spent reasoning.
    pub reasoning_tokens: u64,
    /// All tokens.
    pub total_tokens: u64,
    /// Estimated cost in US dollars (absent when the context has no prices).
    #[serde(
        rename = "estimatedCostUsd",
        skip_serializing_if = "is_zero",
        default,
        with = "crate::contract::response::usd"
    )]
    #[schema(value_type = Option<f64>)]
    pub cost_micros: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// [`crate::contract::response::usd`] for an optional amount.
mod usd_option {
    use serde::{Deserialize as _, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(micros: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match micros {
            Some(m) => crate::contract::response::usd::serialize(m, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        Option::<f64>::deserialize(d)?
            .map(|usd| {
                if (0.0..1e12).contains(&usd) {
                    Ok((usd * 1e6).round() as u64)
                } else {
                    Err(serde::de::Error::custom(
                        "a cost in dollars must be 0 or more",
                    ))
                }
            })
            .transpose()
    }
}

/// Folds a day's tally (`<context>/<field>` → amount) into usage by context. A context's total
/// is its input and output, plus what models reported beyond them (`more_total`); a day
/// tallied by an earlier version, which kept a `total` of its own, shows the larger of that
/// and this (the two agree on any day one version counted whole; on the day of an upgrade the
/// sum counts the calls of both).
pub(super) fn by_context(
    tally: std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, ContextUsage> {
    let mut out: std::collections::BTreeMap<String, ContextUsage> = Default::default();
    let mut totals: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for (name, n) in tally {
        let Some((context, field)) = name.rsplit_once('/') else {
            continue;
        };
        let usage = out.entry(context.to_string()).or_default();
        match field {
            "calls" => usage.calls = n,
            "input" => usage.input_tokens = n,
            "cached_input" => usage.cached_input_tokens = n,
            "output" => usage.output_tokens = n,
            "reasoning" => usage.reasoning_tokens = n,
            "more_total" => totals.entry(context.to_string()).or_default().0 = n,
            "total" => totals.entry(context.to_string()).or_default().1 = n,
            "cost_micros" => usage.cost_micros = n,
            _ => {}
        }
    }
    for (context, usage) in &mut out {
        let (more, kept) = totals.get(context).copied().unwrap_or_default();
        let summed = usage
            .input_tokens
            .saturating_add(usage.output_tokens)
            .saturating_add(more);
        usage.total_tokens = summed.max(kept);
    }
    out
}

/// What a tenant spent on a day ([`Quotas::spent`]).
pub(super) struct DaySpent {
    /// Tokens of every context.
    pub(super) tokens: u64,
    /// Estimated cost of every context, in millionths of a dollar.
    pub(super) cost_micros: u64,
    /// The tally by agent context.
    pub(super) by_context: std::collections::BTreeMap<String, ContextUsage>,
}

impl Quotas {
    /// What `tenant` spent on `day`: its tally by agent context, and the tokens and cost
    /// summed over it — or, for each asked for (`earlier_tokens`, `earlier_cost`), the count
    /// an earlier version kept of its own where that is larger (the day of an upgrade from a
    /// version that kept no tally; [`crate::limiter::LimitStore::earlier_count`]).
    pub(super) async fn spent(
        &self,
        tenant: &str,
        day: &str,
        earlier_tokens: bool,
        earlier_cost: bool,
    ) -> Result<DaySpent, LimitStoreError> {
        let earlier = |wanted: bool, key: String| async move {
            match wanted {
                true => self.store.earlier_count(&key, day).await,
                false => Ok(0),
            }
        };
        let tally_key = key(tenant);
        let (tally, tokens, cost) = tokio::try_join!(
            self.store.tally(&tally_key, day),
            earlier(earlier_tokens, key(tenant)),
            earlier(earlier_cost, cost_key(tenant)),
        )?;
        let by_context = by_context(tally);
        let (summed_tokens, summed_cost) = by_context.values().fold((0u64, 0u64), |(t, c), u| {
            (
                t.saturating_add(u.total_tokens),
                c.saturating_add(u.cost_micros),
            )
        });
        Ok(DaySpent {
            tokens: summed_tokens.max(tokens),
            cost_micros: summed_cost.max(cost),
            by_context,
        })
    }

    /// The tenant's counts now: today's, or those of `day` (`YYYY-MM-DD`) when given (kept
    /// eight days: an older day has none).
    pub async fn usage(
        &self,
        tenant: &str,
        day: Option<&str>,
    ) -> Result<TenantUsage, LimitStoreError> {
        let limits = self.tenants.limits(tenant);
        let (today, resets_at, _) = today();
        let day = day.map_or(today, str::to_string);
        let spent = self.spent(tenant, &day, true, true).await?;
        let running_turns = match limits.max_running_turns {
            Some(_) => Some(self.store.slots_in_use(&key(tenant)).await?),
            None => None,
        };
        Ok(TenantUsage {
            tenant: tenant.to_string(),
            day,
            tokens_used: spent.tokens,
            tokens_per_day: limits.tokens_per_day,
            resets_at,
            running_turns,
            max_running_turns: limits.max_running_turns,
            cost_micros: spent.cost_micros,
            cost_per_day_micros: limits.cost_per_day_micros,
            by_agent_context: spent.by_context,
        })
    }
}
