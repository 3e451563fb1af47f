//! Call limits shared by every process on one Redis: a sorted set of slots per context (score:
//! the slot's expiry) and a next-call time per context, each changed by one Lua script that
//! reads the time from Redis itself, so the clocks of the workers do not matter.

use std::time::Duration;

use crate::store::redis::{RedisConnection, ScriptCall};
use redis::Script;

use super::{LimitStore, LimitStoreError};
use crate::store::redis::{RedisOptions, connection};

/// KEYS: slots. ARGV: token, max, ttl ms. 1 when the slot was taken.
const TRY_SLOT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
return 1
";

/// KEYS: slots. ARGV: token, ttl ms. 1 when the slot was still held.
const RENEW_SLOT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return 1
";

/// KEYS: slots. The number of live slots.
const COUNT_SLOTS: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
";

/// KEYS: next call time (µs). ARGV: interval µs. 0 = go (and the next call may go `interval`
/// later), else the µs to wait. Lua numbers are doubles: µs since 1970 fit exactly.
const TRY_RATE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local next = tonumber(redis.call('GET', KEYS[1]) or '0')
if next > now then return next - now end
local interval = tonumber(ARGV[1])
if interval > 0 then
  redis.call('SET', KEYS[1], string.format('%.0f', now + interval), 'PX', math.ceil(interval / 1000) + 1000)
end
return 0
";

/// KEYS: next call time (µs). ARGV: pause µs.
const SLOW_DOWN: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local expiry = now + tonumber(ARGV[1])
local next = tonumber(redis.call('GET', KEYS[1]) or '0')
if expiry > next then
  redis.call('SET', KEYS[1], string.format('%.0f', expiry), 'PX', math.ceil(tonumber(ARGV[1]) / 1000) + 1000)
end
return 1
";

/// KEYS: a day's tally. ARGV: keep ms, then the tally's field/amount pairs (each amount above
/// 0). Adds them in one step. The tally is kept ARGV[1] from the write that made it (a day's
/// tally is made that day), so the expiry is set only by a write that finds a field new — a
/// sum equal to the amount just added — not by every call.
const ADD_TALLY: &str = r"
local new = false
for i = 2, #ARGV, 2 do
  if redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) == tonumber(ARGV[i + 1]) then new = true end
end
if new then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return 1
";

/// The limits of every process sharing one Redis, under the deployment's namespace.
#[derive(Clone)]
pub struct RedisLimits {
    conn: RedisConnection,
    namespace: String,
    scripts: std::sync::Arc<Scripts>,
}

struct Scripts {
    try_slot: Script,
    renew_slot: Script,
    count_slots: Script,
    try_rate: Script,
    slow_down: Script,
    add_tally: Script,
}

impl std::fmt::Debug for RedisLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimits")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

fn unavailable(e: redis::RedisError) -> LimitStoreError {
    LimitStoreError(e.to_string())
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl RedisLimits {
    /// Connects to `url`; keys go under `namespace`.
    pub async fn connect(
        url: &str,
        namespace: &str,
        options: &RedisOptions,
    ) -> Result<Self, LimitStoreError> {
        let conn = connection(url, options).await.map_err(unavailable)?;
        Ok(Self {
            conn,
            namespace: namespace.to_string(),
            scripts: std::sync::Arc::new(Scripts {
                try_slot: Script::new(TRY_SLOT),
                renew_slot: Script::new(RENEW_SLOT),
                count_slots: Script::new(COUNT_SLOTS),
                try_rate: Script::new(TRY_RATE),
                slow_down: Script::new(SLOW_DOWN),
                add_tally: Script::new(ADD_TALLY),
            }),
        })
    }

    fn key(&self, kind: &str, context: &str) -> String {
        self.day_key(kind, context, None)
    }

    /// `kind`'s key of `context`, for `day` when given (`<kind>:<day>`), made in one
    /// concatenation: the day's keys are named on every model call.
    fn day_key(&self, kind: &str, context: &str, day: Option<&str>) -> String {
        // The context's keys share a hash tag: one cluster slot.
        let ns = self.namespace.as_str();
        match day {
            Some(day) => [ns, ":limit:{", context, "}:", kind, ":", day].concat(),
            None => [ns, ":limit:{", context, "}:", kind].concat(),
        }
    }

    /// `key`'s count for `day`, as versions before 2026-12-05 kept it.
    fn count_key(&self, key: &str, day: &str) -> String {
        self.day_key("tokens", key, Some(day))
    }

    /// `key`'s tally for `day`.
    fn tally_key_of(&self, key: &str, day: &str) -> String {
        self.day_key("usage", key, Some(day))
    }

    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        key: String,
        args: &[String],
    ) -> Result<T, LimitStoreError> {
        let mut call = ScriptCall::new(script, 1);
        call.key(key);
        for a in args {
            call.arg(a);
        }
        call.invoke(&mut self.conn.clone())
            .await
            .map_err(unavailable)
    }
}

#[async_trait::async_trait]
impl LimitStore for RedisLimits {
    async fn try_slot(
        &self,
        context: &str,
        token: &str,
        max: u32,
        ttl: Duration,
    ) -> Result<bool, LimitStoreError> {
        let taken: i64 = self
            .run(
                &self.scripts.try_slot,
                self.key("slots", context),
                &[token.to_string(), max.to_string(), ms(ttl).to_string()],
            )
            .await?;
        Ok(taken == 1)
    }

    async fn renew_slot(
        &self,
        context: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, LimitStoreError> {
        let held: i64 = self
            .run(
                &self.scripts.renew_slot,
                self.key("slots", context),
                &[token.to_string(), ms(ttl).to_string()],
            )
            .await?;
        Ok(held == 1)
    }

    async fn release_slot(&self, context: &str, token: &str) -> Result<(), LimitStoreError> {
        let _: i64 = redis::cmd("ZREM")
            .arg(self.key("slots", context))
            .arg(token)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn try_rate(
        &self,
        context: &str,
        interval: Duration,
    ) -> Result<Option<Duration>, LimitStoreError> {
        let wait: u64 = self
            .run(
                &self.scripts.try_rate,
                self.key("next", context),
                &[us(interval).to_string()],
            )
            .await?;
        Ok((wait > 0).then(|| Duration::from_micros(wait)))
    }

    async fn slow_down(&self, context: &str, pause: Duration) -> Result<(), LimitStoreError> {
        let _: i64 = self
            .run(
                &self.scripts.slow_down,
                self.key("next", context),
                &[us(pause).to_string()],
            )
            .await?;
        Ok(())
    }

    async fn slots_in_use(&self, context: &str) -> Result<u32, LimitStoreError> {
        self.run(&self.scripts.count_slots, self.key("slots", context), &[])
            .await
    }

    async fn earlier_count(&self, key: &str, day: &str) -> Result<u64, LimitStoreError> {
        let n: Option<u64> = redis::cmd("GET")
            .arg(self.count_key(key, day))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(n.unwrap_or(0))
    }

    async fn add_tally(
        &self,
        key: &str,
        day: &str,
        counts: &[(String, u64)],
        keep: Duration,
    ) -> Result<(), LimitStoreError> {
        let mut invocation = self.scripts.add_tally.prepare_invoke();
        invocation.key(self.tally_key_of(key, day)).arg(ms(keep));
        for (field, n) in counts {
            invocation.arg(field).arg(*n);
        }
        invocation
            .invoke_async::<i64>(&mut self.conn.clone())
            .await
            .map(drop)
            .map_err(unavailable)
    }

    fn tally_key(&self, key: &str, day: &str) -> Option<String> {
        Some(self.tally_key_of(key, day))
    }

    async fn tally(
        &self,
        key: &str,
        day: &str,
    ) -> Result<std::collections::BTreeMap<String, u64>, LimitStoreError> {
        redis::cmd("HGETALL")
            .arg(self.tally_key_of(key, day))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)
    }
}
