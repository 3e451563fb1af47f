//! Tenant quotas: how many of a tenant's turns run at once, and how many model tokens it may
//! spend per day (an extension of AGN-034; the tenants come from `APTIX_TENANTS_FILE`).
//!
//! - `maxRunningTurns`: the front door puts a capped tenant's jobs on the tenant's own queue
//!   (its *lane*, see [`crate::queue::Topology::lane`]); a worker takes a lane's job only once
//!   it holds one of the tenant's running slots — slots of a [`LimitStore`] set shared by every
//!   worker, renewed while held, freed when the turn ends or its worker dies. A tenant that
//!   floods its lane waits there; other tenants' jobs never queue behind it.
//! - `tokensPerDay`: every model call adds its `usage` to the tenant's tally for the UTC day
//!   (by agent context: what `GET /v1/tenant/usage` shows); once the day's tokens reach the
//!   quota, the front door refuses the tenant's new user turns with `QUOTA_EXCEEDED` until
//!   midnight UTC. Turns already accepted finish, and tool-result continuations (the rest of
//!   an accepted turn) are still taken.
//!
//! Owns: the quota decisions and the counters. Must not: touch queues or sessions.

pub mod file;
mod spend;
mod usage;

use std::sync::Arc;
use std::time::Duration;

use time::{OffsetDateTime, Time};

use crate::limiter::{HeldSlot, LimitStore, LimitStoreError, MemoryLimits};
use crate::metrics::{Metrics, Tracked};

pub use file::{TenantLimits, Tenants, TenantsError};
pub use spend::Spent;
pub use usage::{ContextUsage, TenantUsage};

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

/// The limiter key of the estimated cost count a tenant's days had before 2026-12-05 (the
/// tally's `cost_micros` counts it now).
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
        let (tokens_quota, cost_quota) = (limits.tokens_per_day, limits.cost_per_day_micros);
        if tokens_quota.is_none() && cost_quota.is_none() {
            return Ok(());
        }
        let (day, resets_at, retry_after_secs) = today();
        let spent = self
            .spent(tenant, &day, tokens_quota.is_some(), cost_quota.is_some())
            .await?;
        let quotas = [
            (
                tokens_quota,
                QuotaUnit::Tokens,
                spent.tokens,
                "tokens_per_day",
            ),
            (
                cost_quota,
                QuotaUnit::CostMicros,
                spent.cost_micros,
                "cost_per_day",
            ),
        ];
        for (quota, unit, used, name) in quotas {
            let Some(quota) = quota else { continue };
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
