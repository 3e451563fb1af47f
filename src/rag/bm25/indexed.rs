//! The tenants a retriever has seen with an index: for those it reads beside the begin step as
//! always; for the others it first lets the begin step look whether an index exists
//! ([`crate::rag::Retriever::absence_probe`]), so a tenant without one costs no read of its own.
//!
//! Only the presence of an index is remembered, never its absence: a tenant that indexes its
//! first folder is retrieved for on its very next turn. An index removed later only costs
//! reads that find nothing, as before.

use std::collections::HashSet;
use std::sync::Mutex;

/// Tenants remembered; a set that outgrows it is dropped whole (they are seen again at the
/// next turn that finds their index).
const REMEMBERED: usize = 4096;

/// The tenants seen with an index (see the module header).
#[derive(Debug, Default)]
pub(super) struct Indexed {
    seen: Mutex<HashSet<String>>,
}

impl Indexed {
    /// Whether `tenant` was seen with an index.
    pub(super) fn contains(&self, tenant: &str) -> bool {
        self.seen.lock().is_ok_and(|seen| seen.contains(tenant))
    }

    /// Notes that `tenant` has an index.
    pub(super) fn note(&self, tenant: &str) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        if seen.contains(tenant) {
            return;
        }
        if seen.len() >= REMEMBERED {
            seen.clear();
        }
        seen.insert(tenant.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_is_known_once_noted_and_a_full_set_starts_again() {
        let indexed = Indexed::default();
        assert!(!indexed.contains("a"));
        indexed.note("a");
        indexed.note("a");
        assert!(indexed.contains("a"));
        for i in 1..REMEMBERED {
            indexed.note(&format!("t{i}"));
        }
        assert!(indexed.contains("a"), "{REMEMBERED} fit");
        indexed.note("one more");
        assert!(!indexed.contains("a") && indexed.contains("one more"));
    }
}
