//! Identifiers that end up in queue names and Redis keys, so they are restricted to a safe
//! charset (`[A-Za-z0-9._:-]`) and 1–128 characters. Holding one means it is valid.

use serde::{Deserialize, Deserializer, Serialize};

/// The longest id accepted.
pub const MAX_ID_LEN: usize = 128;

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The string is empty.
    #[error("must not be empty")]
    Empty,
    /// The string is longer than [`MAX_ID_LEN`].
    #[error("must be at most {MAX_ID_LEN} characters (got {0})")]
    TooLong(usize),
    /// The string contains a character outside the allowed set.
    #[error("contains {0:?}; only letters, digits, '.', '_', ':' and '-' are allowed")]
    BadChar(char),
}

/// Checks the id rules without allocating.
pub fn check_id(s: &str) -> Result<(), IdError> {
    if s.is_empty() {
        return Err(IdError::Empty);
    }
    let len = s.chars().count();
    if len > MAX_ID_LEN {
        return Err(IdError::TooLong(len));
    }
    match s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        Some(c) => Err(IdError::BadChar(c)),
        None => Ok(()),
    }
}

macro_rules! id_type {
    ($(#[doc = $doc:literal])+ $name:ident) => {
        $(#[doc = $doc])+
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
        #[serde(transparent)]
        #[schema(value_type = String, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
        pub struct $name(String);

        impl $name {
            /// Parses a string into a valid id.
            pub fn parse(s: impl Into<String>) -> Result<Self, IdError> {
                let s = s.into();
                check_id(&s)?;
                Ok(Self(s))
            }

            /// A fresh random id (a UUID), always valid.
            pub fn generate() -> Self {
                Self(uuid::Uuid::new_v4().to_string())
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

id_type! {
    /// A client-chosen session id (the conversation "room").
    SessionId
}
id_type! {
    /// A client-chosen turn id, unique within its session.
    TurnId
}
id_type! {
    /// The id of one tool call (the model's `call_id`).
    ToolCallId
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_safe_ids() {
        for ok in ["a", "S-1", "call_abc.DEF:9", &"x".repeat(128)] {
            assert!(SessionId::parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_unsafe_ids() {
        assert_eq!(TurnId::parse(""), Err(IdError::Empty));
        assert_eq!(TurnId::parse("x".repeat(129)), Err(IdError::TooLong(129)));
        assert_eq!(TurnId::parse("a b"), Err(IdError::BadChar(' ')));
        assert_eq!(TurnId::parse("a/b"), Err(IdError::BadChar('/')));
        assert_eq!(TurnId::parse("a{b}"), Err(IdError::BadChar('{')));
        assert_eq!(TurnId::parse("é"), Err(IdError::BadChar('é')));
        assert_eq!(TurnId::parse("a*"), Err(IdError::BadChar('*')));
    }

    #[test]
    fn deserialize_validates() {
        assert!(serde_json::from_str::<ToolCallId>("\"ok_1\"").is_ok());
        assert!(serde_json::from_str::<ToolCallId>("\"not ok\"").is_err());
    }

    #[test]
    fn generated_ids_are_valid() {
        assert!(check_id(SessionId::generate().as_str()).is_ok());
    }
}
