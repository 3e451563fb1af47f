//! Call limits within one process (the embedded deployment and tests).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{LimitStore, LimitStoreError};

/// Slots and next-call times in memory.
#[derive(Debug, Default)]
pub struct MemoryLimits {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// context → token → expiry.
    slots: HashMap<String, HashMap<String, Instant>>,
    /// context → the earliest time of its next call.
    next_call: HashMap<String, Instant>,
    /// (key, day) → field → amount; a key keeps its latest [`TALLY_DAYS`] days.
    tallies: HashMap<(String, String), std::collections::BTreeMap<String, u64>>,
}

/// Days of tallies kept per key in memory.
const TALLY_DAYS: usize = 8;

impl MemoryLimits {
    /// No slots taken, no call made.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, LimitStoreError> {
        self.inner
            .lock()
            .map_err(|_| LimitStoreError("the in-memory limiter's lock is poisoned".into()))
    }
}

impl Inner {
    fn live_slots(&mut self, context: &str, now: Instant) -> &mut HashMap<String, Instant> {
        let slots = self.slots.entry(context.to_string()).or_default();
        slots.retain(|_, until| *until > now);
        slots
    }
}

#[async_trait::async_trait]
impl LimitStore for MemoryLimits {
    async fn try_slot(
        &self,
        context: &str,
        token: &str,
        max: u32,
        ttl: Duration,
    ) -> Result<bool, LimitStoreError> {
        let now = Instant::now();
        let mut inner = self.lock()?;
        let slots = inner.live_slots(context, now);
        if slots.len() >= max as usize {
            return Ok(false);
        }
        slots.insert(token.to_string(), now + ttl);
        Ok(true)
    }

    async fn renew_slot(
        &self,
        context: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, LimitStoreError> {
        let now = Instant::now();
        let mut inner = self.lock()?;
        Ok(match inner.live_slots(context, now).get_mut(token) {
            Some(until) => {
                *until = now + ttl;
                true
            }
            None => false,
        })
    }

    async fn release_slot(&self, context: &str, token: &str) -> Result<(), LimitStoreError> {
        if let Some(slots) = self.lock()?.slots.get_mut(context) {
            slots.remove(token);
        }
        Ok(())
    }

    async fn try_rate(
        &self,
        context: &str,
        interval: Duration,
    ) -> Result<Option<Duration>, LimitStoreError> {
        let now = Instant::now();
        let mut inner = self.lock()?;
        match inner.next_call.get(context) {
            Some(next) if *next > now => Ok(Some(*next - now)),
            _ => {
                inner.next_call.insert(context.to_string(), now + interval);
                Ok(None)
            }
        }
    }

    async fn slow_down(&self, context: &str, pause: Duration) -> Result<(), LimitStoreError> {
        let until = Instant::now() + pause;
        let mut inner = self.lock()?;
        let next = inner.next_call.entry(context.to_string()).or_insert(until);
        *next = (*next).max(until);
        Ok(())
    }

    async fn slots_in_use(&self, context: &str) -> Result<u32, LimitStoreError> {
        let mut inner = self.lock()?;
        let n = inner.live_slots(context, Instant::now()).len();
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    async fn add_tally(
        &self,
        key: &str,
        day: &str,
        counts: &[(String, u64)],
        _keep: Duration,
    ) -> Result<(), LimitStoreError> {
        let mut inner = self.lock()?;
        let tally = inner
            .tallies
            .entry((key.to_string(), day.to_string()))
            .or_default();
        for (field, n) in counts {
            let v = tally.entry(field.clone()).or_default();
            *v = v.saturating_add(*n);
        }
        // Days are `YYYY-MM-DD`: the oldest sort first.
        let mut days: Vec<String> = inner
            .tallies
            .keys()
            .filter(|(k, _)| k == key)
            .map(|(_, d)| d.clone())
            .collect();
        if days.len() > TALLY_DAYS {
            days.sort_unstable();
            for old in &days[..days.len() - TALLY_DAYS] {
                inner.tallies.remove(&(key.to_string(), old.clone()));
            }
        }
        Ok(())
    }

    async fn tally(
        &self,
        key: &str,
        day: &str,
    ) -> Result<std::collections::BTreeMap<String, u64>, LimitStoreError> {
        Ok(self
            .lock()?
            .tallies
            .get(&(key.to_string(), day.to_string()))
            .cloned()
            .unwrap_or_default())
    }
}
