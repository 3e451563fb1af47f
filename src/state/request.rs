//! A model request body exactly as it was sent, stored and read back as is.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A model request body exactly as it was sent: JSON text, stored and read back as is (it is
/// written once, when the call is made, and never looked into by the pipeline again). Shared:
/// the HTTP request sends these bytes without copying them ([`SentRequest::bytes`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SentRequest(#[serde(with = "shared_raw")] Arc<serde_json::value::RawValue>);

impl SentRequest {
    /// Wraps a serialised body.
    pub fn new(json: Box<serde_json::value::RawValue>) -> Self {
        Self(Arc::from(json))
    }

    /// The body's JSON text.
    pub fn json(&self) -> &str {
        self.0.get()
    }

    /// The body's bytes for an HTTP request, sharing this body's memory.
    pub fn bytes(&self) -> bytes::Bytes {
        bytes::Bytes::from_owner(SharedJson(Arc::clone(&self.0)))
    }

    /// The body as a JSON value (for inspection; the pipeline does not need it).
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }
}

/// A shared JSON text seen as bytes (the owner behind [`SentRequest::bytes`]).
struct SharedJson(Arc<serde_json::value::RawValue>);

impl AsRef<[u8]> for SharedJson {
    fn as_ref(&self) -> &[u8] {
        self.0.get().as_bytes()
    }
}

/// Raw JSON behind an `Arc`: written as is, read as a boxed raw value and then shared.
mod shared_raw {
    use std::sync::Arc;

    use serde::{Deserialize as _, Deserializer, Serialize as _, Serializer};
    use serde_json::value::RawValue;

    pub(super) fn serialize<S: Serializer>(raw: &Arc<RawValue>, s: S) -> Result<S::Ok, S::Error> {
        raw.as_ref().serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<RawValue>, D::Error> {
        Box::<RawValue>::deserialize(d).map(Arc::from)
    }
}

impl PartialEq for SentRequest {
    fn eq(&self, other: &Self) -> bool {
        self.json() == other.json()
    }
}
