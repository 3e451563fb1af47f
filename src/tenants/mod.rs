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

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use time::{OffsetDateTime, Time};

use crate::limiter::{HeldSlot, LimitStore, LimitStoreError, MemoryLimits};
use crate::metrics::{Metrics, Tracked};

pub use file::{TenantLimits, Tenants, TenantsError};

/// The label value of tenants that are not in the tenants file (keeps label sets bounded).
pub const OTHER_TENANT_LABEL: &str = "other";

/// How often a held lane job asks again for a running slot.
const SLOT_POLL: Duration = Duration::from_millis(25);

/// How long a day's token count is kept (past its day, so a late reader still finds it).
const KEEP_COUNT: Duration = Duration::from_secs(2 * 24 * 3600);

/// A tenant's daily token quota is spent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tenant {tenant:?} has spent {used} of its {quota} model tokens for {day} (UTC); the quota resets at {resets_at}"
)]
pub struct QuotaExceeded {
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

/// The limiter key of a tenant's running slots and token counts (context ids cannot contain
/// a colon, so the two never meet).
fn key(tenant: &str) -> String {
    format!("tenant:{tenant}")
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
    (
        format!(
            "{:04}-{:02}-{:02}",
            day.year(),
            u8::from(day.month()),
            day.day()
        ),
        resets_at,
        secs,
    )
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

    /// Refuses a new turn of `tenant` when its daily token quota is spent.
    pub async fn check_tokens(&self, tenant: &str) -> Result<(), QuotaError> {
        let Some(quota) = self.tenants.limits(tenant).tokens_per_day else {
            return Ok(());
        };
        let (day, resets_at, retry_after_secs) = today();
        let used = self.store.tokens(&key(tenant), &day).await?;
        if used < quota {
            return Ok(());
        }
        self.metrics
            .quota_rejected(self.label(tenant), "tokens_per_day");
        Err(QuotaExceeded {
            tenant: tenant.to_string(),
            day,
            used,
            quota,
            resets_at,
            retry_after_secs,
        }
        .into())
    }

    /// Counts `tokens` a model call of `tenant`'s turn spent. A count that cannot be written
    /// is logged, not fatal: the call was made and its answer is good.
    pub async fn spend(&self, tenant: &str, tokens: u64) {
        if tokens == 0 {
            return;
        }
        self.metrics.tenant_spent(self.label(tenant), tokens);
        let (day, _, _) = today();
        if let Err(e) = self
            .store
            .add_tokens(&key(tenant), &day, tokens, KEEP_COUNT)
            .await
        {
            tracing::warn!(%tenant, tokens, error = %e, "cannot count the tenant's model tokens; its quota may be overrun");
        }
    }

    /// The tenant's counts now.
    pub async fn usage(&self, tenant: &str) -> Result<TenantUsage, LimitStoreError> {
        let limits = self.tenants.limits(tenant);
        let (day, resets_at, _) = today();
        let tokens_used = self.store.tokens(&key(tenant), &day).await?;
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

    fn quotas(limits: TenantLimits) -> Quotas {
        Quotas::new(
            Tenants::from_limits([("a", limits)]),
            Arc::new(MemoryLimits::new()),
            Arc::default(),
            Duration::from_secs(5),
        )
    }

    #[tokio::test]
    async fn the_token_quota_refuses_once_reached_and_names_the_reset() {
        let q = quotas(TenantLimits {
            max_running_turns: None,
            tokens_per_day: Some(100),
        });
        q.spend("a", 99).await;
        q.check_tokens("a").await.unwrap();
        q.spend("a", 1).await;
        let QuotaError::Exceeded(e) = q.check_tokens("a").await.unwrap_err() else {
            panic!("expected the quota to be exceeded");
        };
        assert_eq!((e.used, e.quota), (100, 100));
        assert!(e.resets_at.ends_with("T00:00:00Z"), "{}", e.resets_at);
        assert!(e.retry_after_secs >= 1 && e.retry_after_secs <= 86_400);
        assert!(e.to_string().contains(&e.resets_at));
        // Another tenant is not affected, nor one without a quota.
        q.spend("b", 1_000).await;
        q.check_tokens("b").await.unwrap();
        assert_eq!(q.usage("b").await.unwrap().tokens_used, 1_000);
    }

    #[tokio::test]
    async fn running_slots_are_capped_and_come_back_when_dropped() {
        let q = quotas(TenantLimits {
            max_running_turns: Some(2),
            tokens_per_day: None,
        });
        assert_eq!(q.lane_of(Some("a")), Some("a"));
        assert_eq!(q.lane_of(Some("b")), None);
        assert!(q.running_slot("b").await.is_none(), "no cap, no slot");
        let one = q.running_slot("a").await.unwrap();
        let _two = q.running_slot("a").await.unwrap();
        assert_eq!(q.usage("a").await.unwrap().running_turns, Some(2));
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
