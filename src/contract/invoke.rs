//! `InvokeResult<T>`: the envelope of every answer (SYS-005, DESIGN.md §2).
//!
//! The type makes "a failed result never carries a `result`" impossible to break: success and
//! failure are two variants, and only the success variant holds a value.

use serde::de::DeserializeOwned;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

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
#[derive(Debug, Clone, PartialEq)]
pub struct InvokeResult<T> {
    outcome: Outcome<T>,
    warnings: Vec<ErrorMessage>,
    result_id: String,
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
        })
    }

    /// Adds warnings (they never turn a success into a failure).
    pub fn with_warnings(mut self, warnings: impl IntoIterator<Item = ErrorMessage>) -> Self {
        self.warnings.extend(warnings);
        self
    }

    /// Replaces the result id (used when a result is re-read from storage, and in tests).
    pub fn with_result_id(mut self, result_id: impl Into<String>) -> Self {
        self.result_id = result_id.into();
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
        }
    }
}

impl<T: Serialize> Serialize for InvokeResult<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
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
}
