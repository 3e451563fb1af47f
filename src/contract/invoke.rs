//! `InvokeResult<T>`: the envelope of every answer (SYS-005, DESIGN.md §2).
//!
//! The type makes "a failed result never carries a `result`" impossible to break: success and
//! failure are two variants, and only the success variant holds a value.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use super::codes::ErrorCode;

/// One error or warning: `{"errorCode", "message", "details"?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ErrorMessage {
    /// The stable code (see [`ErrorCode`]).
    pub error_code: ErrorCode,
    /// Human-readable; for request violations it starts with the JSON path of the field.
    pub message: String,
    /// Optional further detail (never secrets, never raw vendor payloads).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub details: Option<String>,
}

impl ErrorMessage {
    /// An error or warning with a code and a message.
    pub fn new(error_code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            error_code,
            message: message.into(),
            details: None,
        }
    }

    /// Adds detail text.
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = Some(details.into());
        self
    }
}

impl std::fmt::Display for ErrorMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.error_code, self.message)
    }
}

/// Whether an invocation succeeded (with its value) or failed (with at least one error).
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome<T> {
    /// Succeeded with a value.
    Success(T),
    /// Failed; the first error is held apart so the list can never be empty.
    Failure {
        /// The first error.
        first: ErrorMessage,
        /// Any further errors.
        rest: Vec<ErrorMessage>,
    },
}

/// The result envelope: `{"successful", "result"?, "errors", "warnings", "resultId"}`.
///
/// Nothing changes a result once it is made (its builders take it by value), so its JSON text
/// can be written once and copied where it goes again: see [`InvokeResult::written`].
#[derive(Debug, Clone)]
pub struct InvokeResult<T> {
    outcome: Outcome<T>,
    warnings: Vec<ErrorMessage>,
    result_id: String,
    /// Its JSON text, when [`InvokeResult::written`] wrote it: serialising the result copies it.
    text: Option<Arc<RawValue>>,
}

/// Two results are equal when what they say is; whether either holds its text does not count.
impl<T: PartialEq> PartialEq for InvokeResult<T> {
    fn eq(&self, other: &Self) -> bool {
        self.outcome == other.outcome
            && self.warnings == other.warnings
            && self.result_id == other.result_id
    }
}

/// A fresh result id: a GUID without hyphens, uppercase, as the original platform writes them.
pub fn new_result_id() -> String {
    uuid::Uuid::new_v4()
        .simple()
        .to_string()
        .to_ascii_uppercase()
}

impl<T> InvokeResult<T> {
    /// A successful result.
    pub fn success(value: T) -> Self {
        Self {
            outcome: Outcome::Success(value),
            warnings: Vec::new(),
            result_id: new_result_id(),
            text: None,
        }
    }

    /// A failed result with one error.
    pub fn failure(error: ErrorMessage) -> Self {
        Self {
            outcome: Outcome::Failure {
                first: error,
                rest: Vec::new(),
            },
            warnings: Vec::new(),
            result_id: new_result_id(),
            text: None,
        }
    }

    /// A failed result with every error given; `None` when the list is empty (that would not be
    /// a failure).
    pub fn failures(errors: Vec<ErrorMessage>) -> Option<Self> {
        let mut iter = errors.into_iter();
        let first = iter.next()?;
        Some(Self {
            outcome: Outcome::Failure {
                first,
                rest: iter.collect(),
            },
            warnings: Vec::new(),
            result_id: new_result_id(),
            text: None,
        })
    }

    /// Adds warnings (they never turn a success into a failure).
    pub fn with_warnings(mut self, warnings: impl IntoIterator<Item = ErrorMessage>) -> Self {
        self.warnings.extend(warnings);
        self.text = None;
        self
    }

    /// Replaces the result id (used when a result is re-read from storage, and in tests).
    pub fn with_result_id(mut self, result_id: impl Into<String>) -> Self {
        self.result_id = result_id.into();
        self.text = None;
        self
    }

    /// The same result holding its JSON text, written now: every later serialisation of it
    /// (or of a clone) copies the text instead of writing the result again. For a result that
    /// is stored and then published. A result that cannot be written is returned as it was.
    pub fn written(mut self) -> Self
    where
        T: Serialize,
    {
        self.text = None;
        if let Ok(text) = serde_json::value::to_raw_value(&self) {
            self.text = Some(Arc::from(text));
        }
        self
    }

    /// The same result without its written text (see [`InvokeResult::written`]).
    pub fn unwritten(mut self) -> Self {
        self.text = None;
        self
    }

    /// True when there are no errors.
    pub fn is_successful(&self) -> bool {
        matches!(self.outcome, Outcome::Success(_))
    }

    /// The value, present only on success.
    pub fn result(&self) -> Option<&T> {
        match &self.outcome {
            Outcome::Success(v) => Some(v),
            Outcome::Failure { .. } => None,
        }
    }

    /// Consumes the envelope, returning the outcome.
    pub fn into_outcome(self) -> Outcome<T> {
        self.outcome
    }

    /// The errors (empty on success).
    pub fn errors(&self) -> Vec<&ErrorMessage> {
        match &self.outcome {
            Outcome::Success(_) => Vec::new(),
            Outcome::Failure { first, rest } => std::iter::once(first).chain(rest).collect(),
        }
    }

    /// The warnings.
    pub fn warnings(&self) -> &[ErrorMessage] {
        &self.warnings
    }

    /// The result id.
    pub fn result_id(&self) -> &str {
        &self.result_id
    }

    /// Changes the payload type of a failure, keeping its errors, warnings and id
    /// (SYS-005's `Transform<T2>`); a success is mapped with `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> InvokeResult<U> {
        InvokeResult {
            outcome: match self.outcome {
                Outcome::Success(v) => Outcome::Success(f(v)),
                Outcome::Failure { first, rest } => Outcome::Failure { first, rest },
            },
            warnings: self.warnings,
            result_id: self.result_id,
            text: None,
        }
    }
}

impl<T: Serialize> Serialize for InvokeResult<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if let Some(text) = &self.text {
            return text.serialize(serializer);
        }
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("successful", &self.is_successful())?;
        if let Outcome::Success(value) = &self.outcome {
            map.serialize_entry("result", value)?;
        }
        map.serialize_entry("errors", &self.errors())?;
        map.serialize_entry("warnings", &self.warnings)?;
        map.serialize_entry("resultId", &self.result_id)?;
        map.end()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawInvokeResult<T> {
    successful: bool,
    #[serde(default = "Option::default")]
    result: Option<T>,
    #[serde(default)]
    errors: Vec<ErrorMessage>,
    #[serde(default)]
    warnings: Vec<ErrorMessage>,
    #[serde(default)]
    result_id: String,
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for InvokeResult<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let raw = RawInvokeResult::<T>::deserialize(deserializer)?;
        let outcome = match (raw.successful, raw.result, raw.errors.is_empty()) {
            (true, Some(value), true) => Outcome::Success(value),
            (true, None, _) => return Err(D::Error::custom("successful result without `result`")),
            (true, Some(_), false) => {
                return Err(D::Error::custom("successful result with errors"));
            }
            (false, Some(_), _) => return Err(D::Error::custom("failed result with `result`")),
            (false, None, _) => {
                let mut iter = raw.errors.into_iter();
                let first = iter
                    .next()
                    .ok_or_else(|| D::Error::custom("failed result without errors"))?;
                Outcome::Failure {
                    first,
                    rest: iter.collect(),
                }
            }
        };
        Ok(Self {
            outcome,
            warnings: raw.warnings,
            result_id: raw.result_id,
            text: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn failed_result_has_no_result_key() {
        let r: InvokeResult<String> =
            InvokeResult::failure(ErrorMessage::new(ErrorCode::TurnNotFound, "no such turn"))
                .with_result_id("R1");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            json!({"successful": false,
                   "errors": [{"errorCode": "TURN_NOT_FOUND", "message": "no such turn"}],
                   "warnings": [], "resultId": "R1"})
        );
    }

    #[test]
    fn failures_of_empty_list_is_none() {
        assert!(InvokeResult::<()>::failures(vec![]).is_none());
    }

    #[test]
    fn deserialize_rejects_failed_with_result_and_success_without() {
        let bad = r#"{"successful":false,"result":"x","errors":[{"errorCode":"INTERNAL","message":"m"}],"warnings":[],"resultId":"R"}"#;
        assert!(serde_json::from_str::<InvokeResult<String>>(bad).is_err());
        let bad = r#"{"successful":true,"errors":[],"warnings":[],"resultId":"R"}"#;
        assert!(serde_json::from_str::<InvokeResult<String>>(bad).is_err());
        let bad = r#"{"successful":false,"errors":[],"warnings":[],"resultId":"R"}"#;
        assert!(serde_json::from_str::<InvokeResult<String>>(bad).is_err());
        let good = r#"{"successful":true,"result":"x","errors":[],"warnings":[],"resultId":"R"}"#;
        let r: InvokeResult<String> = serde_json::from_str(good).unwrap();
        assert_eq!(r.result().map(String::as_str), Some("x"));
    }

    #[test]
    fn map_keeps_errors_and_warnings() {
        let r: InvokeResult<u32> =
            InvokeResult::failure(ErrorMessage::new(ErrorCode::Internal, "boom"))
                .with_warnings([ErrorMessage::new(ErrorCode::UnknownField, "w")]);
        let id = r.result_id().to_string();
        let m = r.map(|n| n.to_string());
        assert!(!m.is_successful());
        assert_eq!(m.errors().len(), 1);
        assert_eq!(m.warnings().len(), 1);
        assert_eq!(m.result_id(), id);
    }

    /// A written result serialises to the same bytes as before it was written, inside a
    /// record, as a `Value` and as pretty text; a builder used afterwards writes the new
    /// content, not the old text; and whether a result holds its text never makes it unequal.
    #[test]
    fn a_written_result_serialises_as_it_did_and_forgets_its_text_when_changed() {
        #[derive(Serialize)]
        struct Holder<'a> {
            before: u32,
            result: &'a InvokeResult<Vec<String>>,
            after: &'a str,
        }
        let warned = || [ErrorMessage::new(ErrorCode::UnknownField, "w \"quoted\"\n")];
        let cases = [
            InvokeResult::success(vec!["a".to_string(), "é\u{1}".to_string()]),
            InvokeResult::success(Vec::new()).with_warnings(warned()),
            InvokeResult::failure(ErrorMessage::new(ErrorCode::Internal, "boom").with_details("d")),
        ];
        for plain in cases {
            let written = plain.clone().written();
            assert!(written.text.is_some(), "the text is kept");
            assert_eq!(written, plain);
            let bytes = |r: &InvokeResult<Vec<String>>| {
                serde_json::to_vec(&Holder {
                    before: 1,
                    result: r,
                    after: "x",
                })
                .unwrap()
            };
            assert_eq!(bytes(&written), bytes(&plain));
            assert_eq!(bytes(&written.clone()), bytes(&plain));
            assert_eq!(
                serde_json::to_value(&written).unwrap(),
                serde_json::to_value(&plain).unwrap()
            );
            assert_eq!(
                serde_json::to_string_pretty(&written.clone().unwritten()).unwrap(),
                serde_json::to_string_pretty(&plain).unwrap()
            );
            // Changed after it was written: the new content, not the old text.
            let renamed = written.clone().with_result_id("R2");
            assert_eq!(
                serde_json::to_value(&renamed).unwrap()["resultId"],
                json!("R2")
            );
            let warned_after = written.clone().with_warnings(warned());
            assert_eq!(
                serde_json::to_vec(&warned_after).unwrap(),
                serde_json::to_vec(&plain.clone().with_warnings(warned())).unwrap()
            );
            let mapped = written.map(|v| v.len());
            assert_eq!(
                serde_json::to_value(&mapped).unwrap(),
                serde_json::to_value(plain.map(|v| v.len())).unwrap()
            );
        }
    }
}
