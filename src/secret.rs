//! A value that must never be printed: URLs with credentials, API keys.
//!
//! Owns: hiding the value in `Debug`. Must not: depend on anything else in the crate.

/// A value that must never appear in logs or debug output.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    /// The secret itself; call only where it is sent on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "Secret(<empty>)"
        } else {
            "Secret(***)"
        })
    }
}
