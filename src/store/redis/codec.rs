//! How the Redis store's values are written and read back: JSON, with a value that does not
//! decode named by its key, and a turn record joined with its tool-output ledger.

use super::super::{StoreError, TurnRecord};
use crate::state::RUNS_BEGUN;

pub(super) fn decode<T: serde::de::DeserializeOwned>(
    key: &str,
    raw: Option<String>,
) -> Result<Option<T>, StoreError> {
    raw.map(|s| {
        serde_json::from_str(&s).map_err(|error| StoreError::Decode {
            key: key.to_string(),
            error,
        })
    })
    .transpose()
}

/// A stored turn record with its ledger: the ledger hash is the source of truth for recorded
/// tool outputs (a later save of an older copy of the record cannot lose one) and holds the
/// count of runs begun ([`RUNS_BEGUN`]), which is not a tool output.
pub(super) fn with_ledger(
    key: &str,
    raw: Option<String>,
    mut ledger: std::collections::BTreeMap<String, String>,
) -> Result<Option<TurnRecord>, StoreError> {
    let runs = ledger.remove(RUNS_BEGUN);
    let mut record: Option<TurnRecord> = decode(key, raw)?;
    if let Some(r) = record.as_mut() {
        r.tool_ledger.extend(ledger);
        if let Some(runs) = runs {
            r.with_runs_begun(runs_begun(key, &runs)?);
        }
    }
    Ok(record)
}

/// The ledger's count of runs begun, as stored.
pub(super) fn runs_begun(key: &str, raw: &str) -> Result<u32, StoreError> {
    raw.parse().map_err(|_| {
        StoreError::Corrupt(format!(
            "{key}: the count of runs begun is not a number: {raw:?}"
        ))
    })
}

pub(super) fn encode<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(StoreError::Encode)
}
