//! A model request body: as it goes out ([`WireRequest`], in pieces) and as a turn's
//! transcript keeps it ([`SentRequest`], stored and read back as is).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A model request body as a turn's transcript keeps it: JSON text, stored and read back as is
/// (it is written once, when the call is made, and never looked into by the pipeline again).
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

    /// The body as a JSON value (for inspection; the pipeline does not need it).
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(self.0.get())
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

/// A model request body as it goes out, in two pieces never joined in memory: the opening its
/// prompt gives every call with that prompt (instructions, tools, the start of `input` — the
/// bulk of a body, made once and shared), then the call's own bytes (the rest of `input` and
/// the call's other members). A call waiting on its answer holds only its own piece.
#[derive(Debug, Clone, Default)]
pub struct WireRequest {
    opening: bytes::Bytes,
    own: bytes::Bytes,
}

impl WireRequest {
    /// A body that is `opening` then `own`, together one JSON object.
    pub fn new(opening: bytes::Bytes, own: bytes::Bytes) -> Self {
        Self { opening, own }
    }

    /// A body in one piece.
    pub fn whole(json: impl Into<bytes::Bytes>) -> Self {
        Self {
            opening: bytes::Bytes::new(),
            own: json.into(),
        }
    }

    /// Its pieces, in order.
    pub fn pieces(&self) -> [&bytes::Bytes; 2] {
        [&self.opening, &self.own]
    }

    /// The body in one piece (a copy; for inspection and tests, not for sending).
    pub fn joined(&self) -> Vec<u8> {
        [&self.opening[..], &self.own[..]].concat()
    }

    /// The body as a JSON value (for inspection; the pipeline does not need it).
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_slice(&self.joined())
    }
}
