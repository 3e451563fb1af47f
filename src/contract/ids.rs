//! Identifiers that end up in queue names and Redis keys, so they are restricted to a safe
//! charset (`[A-Za-z0-9._:-]`) and 1–128 characters. Holding one means it is valid.
//!
//! A session id names a session *within its tenant* (DESIGN §10): once the front door or the
//! worker knows whose request it holds, [`SessionId::within`] scopes the client's id to that
//! tenant, and every key, queue and binding is made from the scoped id, so two tenants' `s1`
//! are two sessions. The scoped form is `<tenant>/<id>` (`/` is outside the id charset, so a
//! client cannot write one); the local tenant's ids are not scoped, which keeps the keys of a
//! deployment without tokens what they always were. What clients read (JSON, messages) is the
//! client's id: a `SessionId` serializes without its scope; the records that must keep it say
//! so with `#[serde(with = "scoped")]`.

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
    /// A tenant name longer than [`MAX_TENANT_LEN`].
    #[error("a tenant name must be at most {MAX_TENANT_LEN} characters (got {0})")]
    TenantTooLong(usize),
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

        id_methods!($name);

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// What every id type has: parsing, a fresh random id, its text.
macro_rules! id_methods {
    ($name:ident) => {
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
    };
}

/// The tenant of callers when no API tokens are configured (loopback only), and of jobs that
/// name none. Its session ids are not scoped.
pub const LOCAL_TENANT: &str = "local";

/// The mark between a scoped session id's tenant and the client's id (outside the id charset).
const SCOPE_MARK: char = '/';

/// A session id: the client's (as parsed), or scoped to its tenant ([`SessionId::within`]).
/// `Display` and [`SessionId::as_str`] give the scoped form (keys, queue names, logs);
/// serializing gives the client's id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, utoipa::ToSchema)]
#[schema(value_type = String, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
pub struct SessionId(String);

id_methods!(SessionId);

impl SessionId {
    /// This session id within `tenant`'s sessions: the client's id scoped to `tenant` (the
    /// local tenant's ids stay as they are). A scope the id already had is replaced.
    pub fn within(&self, tenant: &str) -> Self {
        let id = self.client_id();
        if tenant == LOCAL_TENANT {
            return Self(id.to_string());
        }
        let mut scoped = String::with_capacity(tenant.len() + 1 + id.len());
        scoped.push_str(tenant);
        scoped.push(SCOPE_MARK);
        scoped.push_str(id);
        Self(scoped)
    }

    /// The id the client chose (without the tenant's scope).
    pub fn client_id(&self) -> &str {
        self.0
            .rsplit_once(SCOPE_MARK)
            .map_or(self.0.as_str(), |(_, id)| id)
    }

    /// The tenant whose session this is ([`LOCAL_TENANT`] for an id that is not scoped).
    pub fn tenant(&self) -> &str {
        self.0
            .rsplit_once(SCOPE_MARK)
            .map_or(LOCAL_TENANT, |(tenant, _)| tenant)
    }

    /// Reads a stored id, scoped or not: the client's part must be an id and the tenant part
    /// a tenant name ([`check_tenant`]).
    pub fn parse_scoped(s: impl Into<String>) -> Result<Self, IdError> {
        let s = s.into();
        match s.rsplit_once(SCOPE_MARK) {
            Some((tenant, id)) => {
                check_tenant(tenant)?;
                check_id(id)?;
            }
            None => check_id(&s)?,
        }
        Ok(Self(s))
    }
}

/// The longest tenant name accepted (a scoped session id stays short enough for a queue name).
pub const MAX_TENANT_LEN: usize = 64;

/// Checks a tenant name: the id charset, 1–[`MAX_TENANT_LEN`] characters.
pub fn check_tenant(s: &str) -> Result<(), IdError> {
    check_id(s)?;
    match s.chars().count() {
        n if n > MAX_TENANT_LEN => Err(IdError::TenantTooLong(n)),
        _ => Ok(()),
    }
}

/// Clients see their own id: the scope is never written.
impl Serialize for SessionId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.client_id())
    }
}

/// Reads a client's id (a scoped one is refused: only [`scoped`] fields hold those).
impl<'de> Deserialize<'de> for SessionId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(s).map_err(serde::de::Error::custom)
    }
}

/// `#[serde(with = "scoped")]`: a stored session id with its tenant's scope.
pub mod scoped {
    use super::SessionId;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the scoped form.
    pub fn serialize<S: Serializer>(id: &SessionId, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(id.as_str())
    }

    /// Reads the scoped form (or an id that was never scoped).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SessionId, D::Error> {
        let s = String::deserialize(d)?;
        SessionId::parse_scoped(s).map_err(serde::de::Error::custom)
    }
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
    fn a_session_id_is_scoped_to_its_tenant_and_shows_clients_their_own() {
        let sid = SessionId::parse("s:1").unwrap();
        let a = sid.within("acme");
        assert_eq!(a.as_str(), "acme/s:1");
        assert_eq!((a.client_id(), a.tenant()), ("s:1", "acme"));
        assert_ne!(a, sid.within("globex"), "two tenants' s:1 are two sessions");
        assert_eq!(a.within("acme"), a, "scoping again changes nothing");
        assert_eq!(
            a.within("globex").as_str(),
            "globex/s:1",
            "a scope is replaced"
        );
        // The local tenant keeps bare ids (a deployment without tokens keeps its keys).
        assert_eq!(sid.within(LOCAL_TENANT), sid);
        assert_eq!((sid.client_id(), sid.tenant()), ("s:1", LOCAL_TENANT));
        // Clients read their own id; stored records keep the scope, and read it back.
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"s:1\"");
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Stored {
            #[serde(with = "scoped")]
            sid: SessionId,
        }
        let stored = serde_json::to_string(&Stored { sid: a.clone() }).unwrap();
        assert_eq!(stored, r#"{"sid":"acme/s:1"}"#);
        assert_eq!(serde_json::from_str::<Stored>(&stored).unwrap().sid, a);
        // A client cannot name a scope: the mark is outside the id charset.
        assert!(SessionId::parse("acme/s:1").is_err());
        assert!(serde_json::from_str::<SessionId>("\"acme/s:1\"").is_err());
        assert!(SessionId::parse_scoped("a{b}/s").is_err());
        assert!(SessionId::parse_scoped(format!("{}/s", "t".repeat(65))).is_err());
    }

    #[test]
    fn generated_ids_are_valid() {
        assert!(check_id(SessionId::generate().as_str()).is_ok());
    }
}
