//! Tenant quotas: how many of a tenant's turns run at once, and how many model tokens it may
//! spend per day (an extension of AGN-034; the tenants come from `APTIX_TENANTS_FILE`).
//!
//! - `maxRunningTurns`: the front door puts a capped tenant's jobs on the tenant's own queue
//!   (its *lane*, see [`crate::queue::Topology::lane`]); a worker takes a lane's job only once
//!   it holds one of the tenant's running slots — slots of a [`LimitStore`] set shared by every
//!   worker, renewed while held, freed when the turn ends or its worker dies. A tenant that
//!   floods its lane waits there; other tenants' jobs never queue behind it.
//! - `tokensPerDay`: every model call adds its `usage` to the tenant's count for the UTC day;
//!   once the count reaches the quota, the front door refuses the tenant's new user turns with
//!   `QUOTA_EXCEEDED` until midnight UTC. Turns already accepted finish, and tool-result
//!   continuations (the rest of an accepted turn) are still taken.
//!
//! Owns: the quota decisions and the counters. Must not: touch queues or sessions.

pub mod file;
mod spend;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use time::{OffsetDateTime, Time};

use crate::limiter::{HeldSlot, LimitStore, LimitStoreError, MemoryLimits};
use crate::metrics::{Metrics, Tracked};

pub use file::{TenantLimits, Tenants, TenantsError};
pub use spend::Spent;

/// The label value of tenants that are not in the tenants file (keeps label sets bounded).
pub const OTHER_TENANT_LABEL: &str = "other";

/// How often a held lane job asks again for a running slot.
const SLOT_POLL: Duration = Duration::from_millis(25);

/// How long a day's counts are kept, from the write that made them — made on their day, so
/// they last past it and a late reader still finds them.
const KEEP_COUNT: Duration = Duration::from_secs(8 * 24 * 3600);

/// What a daily quota counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaUnit {
    /// Model tokens (`tokensPerDay`).
    Tokens,
    /// Estimated cost in millionths of a dollar (`costPerDay`).
    CostMicros,
}

/// A tenant's daily token (or cost) quota is spent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct QuotaExceeded {
    /// What the quota counts.
    pub unit: QuotaUnit,
    /// The tenant.
    pub tenant: String,
    /// The UTC day, `YYYY-MM-DD`.
    pub day: String,
    /// Tokens counted that day.
    pub used: u64,
    /// The quota.
    pub quota: u64,
    /// The next midnight UTC (RFC 3339).
    pub resets_at: String,
    /// Seconds until then (for `Retry-After`).
    pub retry_after_secs: u64,
}

impl QuotaExceeded {
    fn describe(&self) -> String {
        let (tenant, day, resets_at) = (&self.tenant, &self.day, &self.resets_at);
        let spent = match self.unit {
            QuotaUnit::Tokens => format!("{} of its {} model tokens", self.used, self.quota),
            QuotaUnit::CostMicros => format!(
                "${:.2} of its ${:.2} of estimated model cost",
                self.used as f64 / 1e6,
                self.quota as f64 / 1e6
            ),
        };
        format!(
            "tenant {tenant:?} has spent {spent} for {day} (UTC); the quota resets at {resets_at}"
        )
    }
}

/// Why a tenant's turn may not be accepted.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// The quota is spent.
    #[error(transparent)]
    Exceeded(#[from] QuotaExceeded),
    /// The counts cannot be read; nothing is accepted rather than spending past the quota.
    #[error("the tenant's quota cannot be checked: {0}")]
    Unavailable(LimitStoreError),
}

impl From<LimitStoreError> for QuotaError {
    fn from(e: LimitStoreError) -> Self {
        Self::Unavailable(e)
    }
}

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
fn by_context(
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

/// The quotas of every tenant, over the counters every process shares.
#[derive(Clone)]
pub struct Quotas {
    tenants: Arc<Tenants>,
    store: Arc<dyn LimitStore>,
    metrics: Arc<Metrics>,
    slot_ttl: Duration,
}

impl std::fmt::Debug for Quotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quotas")
            .field("tenants", &self.tenants)
            .field("slot_ttl", &self.slot_ttl)
            .finish_non_exhaustive()
    }
}

impl Default for Quotas {
    /// No tenant has limits; tokens are counted in this process.
    fn default() -> Self {
        Self::new(
            Tenants::default(),
            Arc::new(MemoryLimits::new()),
            Arc::default(),
            Duration::from_secs(30),
        )
    }
}

/// A tenant's running slot, held while one of its turns runs.
#[derive(Debug)]
pub struct RunningSlot {
    _slot: HeldSlot,
    _gauge: Tracked,
}

/// The limiter key of a tenant's running slots, token counts and tally (context ids cannot
/// contain a colon, so the two never meet).
fn key(tenant: &str) -> String {
    format!("tenant:{tenant}")
}

/// The limiter key of a tenant's estimated cost count.
fn cost_key(tenant: &str) -> String {
    format!("tenant-cost:{tenant}")
}

/// Today (UTC) as `YYYY-MM-DD`, the next midnight (RFC 3339) and the seconds until it.
fn today() -> (String, String, u64) {
    let now = OffsetDateTime::now_utc();
    let day = now.date();
    let next = day
        .next_day()
        .map_or(now, |d| d.with_time(Time::MIDNIGHT).assume_utc());
    let resets_at = next
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let secs = u64::try_from((next - now).whole_seconds())
        .unwrap_or(0)
        .max(1);
    (day_text(day), resets_at, secs)
}

/// Today (UTC) as `YYYY-MM-DD`: the day a model call's spending is counted under (every
/// call's, so written digit by digit rather than through `format!`).
fn count_day() -> String {
    day_text(OffsetDateTime::now_utc().date())
}

/// `day` as `YYYY-MM-DD`, as `format!("{:04}-{:02}-{:02}")` writes it.
fn day_text(day: time::Date) -> String {
    match crate::digits::date(day) {
        // Digits and dashes: ASCII, so always UTF-8.
        Some(text) => String::from_utf8_lossy(&text).into_owned(),
        None => format!(
            "{:04}-{:02}-{:02}",
            day.year(),
            u8::from(day.month()),
            day.day()
        ),
    }
}

impl Quotas {
    /// Quotas for `tenants`, counted in `store`; a running slot whose worker died frees after
    /// `slot_ttl`.
    pub fn new(
        tenants: Tenants,
        store: Arc<dyn LimitStore>,
        metrics: Arc<Metrics>,
        slot_ttl: Duration,
    ) -> Self {
        metrics.register_tenants(tenants.iter().map(|(id, _)| id));
        Self {
            tenants: Arc::new(tenants),
            store,
            metrics,
            slot_ttl,
        }
    }

    /// The configured tenants.
    pub fn tenants(&self) -> &Tenants {
        &self.tenants
    }

    /// The tenant's label value in metrics: its id if configured, else `other`.
    pub fn label<'a>(&'a self, tenant: &'a str) -> &'a str {
        if self.tenants.is_configured(tenant) {
            tenant
        } else {
            OTHER_TENANT_LABEL
        }
    }

    /// The lane a tenant's jobs go to: its own when its running turns are capped.
    pub fn lane_of<'a>(&self, tenant: Option<&'a str>) -> Option<&'a str> {
        tenant.filter(|t| self.tenants.limits(t).max_running_turns.is_some())
    }

    /// Refuses a new turn of `tenant` when its daily token (or cost) quota is spent.
    pub async fn check_tokens(&self, tenant: &str) -> Result<(), QuotaError> {
        let limits = self.tenants.limits(tenant);
        let quotas = [
            (
                limits.tokens_per_day,
                QuotaUnit::Tokens,
                key(tenant),
                "tokens_per_day",
            ),
            (
                limits.cost_per_day_micros,
                QuotaUnit::CostMicros,
                cost_key(tenant),
                "cost_per_day",
            ),
        ];
        for (quota, unit, counter, name) in quotas {
            let Some(quota) = quota else { continue };
            let (day, resets_at, retry_after_secs) = today();
            let used = self.store.tokens(&counter, &day).await?;
            if used < quota {
                continue;
            }
            self.metrics.quota_rejected(self.label(tenant), name);
            return Err(QuotaExceeded {
                unit,
                tenant: tenant.to_string(),
                day,
                used,
                quota,
                resets_at,
                retry_after_secs,
            }
            .into());
        }
        Ok(())
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
        let (k, cost) = (key(tenant), cost_key(tenant));
        let (tokens_used, tally, cost_micros) = tokio::try_join!(
            self.store.tokens(&k, &day),
            self.store.tally(&k, &day),
            self.store.tokens(&cost, &day),
        )?;
        let running_turns = match limits.max_running_turns {
            Some(_) => Some(self.store.slots_in_use(&key(tenant)).await?),
            None => None,
        };
        Ok(TenantUsage {
            tenant: tenant.to_string(),
            day,
            tokens_used,
            tokens_per_day: limits.tokens_per_day,
            resets_at,
            running_turns,
            max_running_turns: limits.max_running_turns,
            cost_micros,
            cost_per_day_micros: limits.cost_per_day_micros,
            by_agent_context: by_context(tally),
        })
    }

    /// Waits until one of `tenant`'s running slots is free and takes it (at once for a tenant
    /// without a cap). Cancel the future to stop waiting.
    pub async fn running_slot(&self, tenant: &str) -> Option<RunningSlot> {
        let max = self.tenants.limits(tenant).max_running_turns?;
        let label = self.label(tenant).to_string();
        let _waiting = self.metrics.tenant_turn_waiting(&label);
        let (key, token) = (key(tenant), uuid::Uuid::new_v4().simple().to_string());
        loop {
            match self.store.try_slot(&key, &token, max, self.slot_ttl).await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(%tenant, error = %e, "cannot take a running slot; waiting");
                }
            }
            tokio::time::sleep(SLOT_POLL + SLOT_POLL.mul_f64(fastrand::f64() / 4.0)).await;
        }
        Some(RunningSlot {
            _slot: HeldSlot::renewed(&self.store, &key, token, self.slot_ttl),
            _gauge: self.metrics.tenant_turn_running(&label),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Usage;

    /// A limit store without counters of its own to name (memory) leaves the counting to
    /// `spend`; a call that spent nothing adds no counter anywhere.
    #[test]
    fn counts_go_in_a_write_only_where_the_store_names_its_counters() {
        let q = quotas(TenantLimits::default());
        assert_eq!(q.counts_in_write("a", "default", tokens(5, 0)), None);
        let nothing = q.counts_in_write("a", "default", tokens(0, 0)).unwrap();
        assert!(nothing.adds.is_empty());
    }

    /// The day a spending counts under: `format!`'s text for any day (`crate::digits` checks
    /// the four-digit years day by day), and today's either way it is asked.
    #[test]
    fn a_days_text_is_year_month_day() {
        let leap = time::Date::from_calendar_date(2028, time::Month::February, 29).unwrap();
        assert_eq!(day_text(leap), "2028-02-29");
        assert_eq!(day_text(time::Date::MIN), "-9999-01-01");
        assert_eq!(day_text(time::Date::MAX), "9999-12-31");
        // Either side of a midnight.
        let (before, _, _) = today();
        let day = count_day();
        let (after, _, _) = today();
        assert!(
            day == before || day == after,
            "{day} is not {before} or {after}"
        );
    }

    fn quotas(limits: TenantLimits) -> Quotas {
        Quotas::new(
            Tenants::from_limits([("a", limits)]),
            Arc::new(MemoryLimits::new()),
            Arc::default(),
            Duration::from_secs(5),
        )
    }

    /// Usage of `total` tokens (all input), costing `cost_micros`.
    fn tokens(total: u64, cost_micros: u64) -> Usage {
        Usage {
            prompt_tokens: total,
            total_tokens: total,
            cost_micros,
            ..Usage::default()
        }
    }

    #[tokio::test]
    async fn the_token_quota_refuses_once_reached_and_names_the_reset() {
        let q = quotas(TenantLimits {
            tokens_per_day: Some(100),
            ..TenantLimits::default()
        });
        q.spend("a", "default", tokens(99, 0)).await;
        q.check_tokens("a").await.unwrap();
        q.spend("a", "default", tokens(1, 0)).await;
        let QuotaError::Exceeded(e) = q.check_tokens("a").await.unwrap_err() else {
            panic!("expected the quota to be exceeded");
        };
        assert_eq!((e.used, e.quota), (100, 100));
        assert!(e.resets_at.ends_with("T00:00:00Z"), "{}", e.resets_at);
        assert!(e.retry_after_secs >= 1 && e.retry_after_secs <= 86_400);
        assert!(e.to_string().contains(&e.resets_at));
        // Another tenant is not affected, nor one without a quota.
        q.spend("b", "default", tokens(1_000, 0)).await;
        q.check_tokens("b").await.unwrap();
        assert_eq!(q.usage("b", None).await.unwrap().tokens_used, 1_000);
    }

    #[tokio::test]
    async fn the_cost_quota_refuses_once_reached_and_usage_is_kept_by_context() {
        let q = quotas(TenantLimits {
            cost_per_day_micros: Some(2_000_000),
            ..TenantLimits::default()
        });
        q.spend("a", "openai", tokens(10, 1_500_000)).await;
        q.check_tokens("a").await.unwrap();
        q.spend("a", "vllm", tokens(5, 0)).await;
        q.spend("a", "openai", tokens(10, 500_000)).await;
        let QuotaError::Exceeded(e) = q.check_tokens("a").await.unwrap_err() else {
            panic!("expected the cost quota to be exceeded");
        };
        assert_eq!(e.unit, QuotaUnit::CostMicros);
        assert!(e.to_string().contains("$2.00 of its $2.00"), "{e}");
        let usage = q.usage("a", None).await.unwrap();
        assert_eq!((usage.tokens_used, usage.cost_micros), (25, 2_000_000));
        let openai = &usage.by_agent_context["openai"];
        assert_eq!((openai.calls, openai.total_tokens), (2, 20));
        assert_eq!(openai.cost_micros, 2_000_000);
        assert_eq!(usage.by_agent_context["vllm"].calls, 1);
        let shown = serde_json::to_value(&usage).unwrap();
        assert_eq!(shown["estimatedCostUsd"], 2.0);
        assert_eq!(shown["costPerDayUsd"], 2.0);
        assert!(
            shown["byAgentContext"]["vllm"]
                .get("estimatedCostUsd")
                .is_none()
        );
    }

    #[tokio::test]
    async fn running_slots_are_capped_and_come_back_when_dropped() {
        let q = quotas(TenantLimits {
            max_running_turns: Some(2),
            ..TenantLimits::default()
        });
        assert_eq!(q.lane_of(Some("a")), Some("a"));
        assert_eq!(q.lane_of(Some("b")), None);
        assert!(q.running_slot("b").await.is_none(), "no cap, no slot");
        let one = q.running_slot("a").await.unwrap();
        let _two = q.running_slot("a").await.unwrap();
        assert_eq!(q.usage("a", None).await.unwrap().running_turns, Some(2));
        let third = tokio::time::timeout(Duration::from_millis(200), q.running_slot("a")).await;
        assert!(third.is_err(), "a third slot was granted over the cap");
        drop(one);
        let third = tokio::time::timeout(Duration::from_secs(2), q.running_slot("a")).await;
        assert!(third.is_ok_and(|s| s.is_some()));
    }

    #[test]
    fn labels_are_bounded_to_configured_tenants() {
        let q = quotas(TenantLimits::default());
        assert_eq!(q.label("a"), "a");
        assert_eq!(q.label("someone-else"), OTHER_TENANT_LABEL);
    }
}
