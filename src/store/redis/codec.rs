//! How the Redis store's values are written and read back: JSON, with a value that does not
//! decode named by its key, and a turn record joined with its tool-output ledger.

use super::super::{StoreError, TurnRecord};

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
/// tool outputs (a later save of an older copy of the record cannot lose one).
pub(super) fn with_ledger(
    key: &str,
    raw: Option<String>,
    ledger: std::collections::BTreeMap<String, String>,
) -> Result<Option<TurnRecord>, StoreError> {
    let mut record: Option<TurnRecord> = decode(key, raw)?;
    if let Some(r) = record.as_mut() {
        r.tool_ledger.extend(ledger);
    }
    Ok(record)
}

pub(super) fn encode<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(StoreError::Encode)
}
