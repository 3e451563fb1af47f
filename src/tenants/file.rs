//! The tenants file (`APTIX_TENANTS_FILE`): which tenants have limits, and what they are.
//!
//! ```json
//! { "tenants": [ { "id": "acme", "maxRunningTurns": 8, "tokensPerDay": 2000000 } ] }
//! ```
//!
//! Both limits are optional; a tenant that is not in the file has none. Ids become part of
//! queue names and metric labels, so they are short and plain.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The limits of one tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantLimits {
    /// At most this many of the tenant's turns run at once, across every worker.
    pub max_running_turns: Option<u32>,
    /// Model tokens (input + output, from `usage`) the tenant may spend per UTC day.
    pub tokens_per_day: Option<u64>,
}

/// Every tenant with limits, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenants {
    by_id: BTreeMap<String, TenantLimits>,
}

/// A tenants file that cannot be used; the message names the file or the entry.
#[derive(Debug, thiserror::Error)]
pub enum TenantsError {
    /// The file cannot be read.
    #[error("cannot read the tenants file {}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not the expected JSON (unknown fields included).
    #[error("the tenants file is not valid: {0}")]
    Malformed(String),
    /// One entry breaks a rule.
    #[error("tenants[{index}] ({id:?}): {problem}")]
    Entry {
        /// Its position in the file.
        index: usize,
        /// Its id as written.
        id: String,
        /// What is wrong.
        problem: String,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileShape {
    tenants: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Entry {
    id: String,
    max_running_turns: Option<u32>,
    tokens_per_day: Option<u64>,
}

/// The longest tenant id (it is part of a queue name).
const MAX_ID_LEN: usize = 64;

impl Tenants {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Self, TenantsError> {
        let text = std::fs::read_to_string(path).map_err(|source| TenantsError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Checks the text of a tenants file.
    pub fn parse(text: &str) -> Result<Self, TenantsError> {
        let shape: FileShape =
            serde_json::from_str(text).map_err(|e| TenantsError::Malformed(e.to_string()))?;
        let mut by_id = BTreeMap::new();
        for (index, entry) in shape.tenants.into_iter().enumerate() {
            let problem = |problem: &str| TenantsError::Entry {
                index,
                id: entry.id.clone(),
                problem: problem.to_string(),
            };
            let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
            if entry.id.is_empty() || entry.id.len() > MAX_ID_LEN || !entry.id.chars().all(plain) {
                return Err(problem(
                    "an id is 1 to 64 characters of letters, digits, '-', '_' and '.'",
                ));
            }
            if entry.max_running_turns == Some(0) {
                return Err(problem(
                    "maxRunningTurns must be at least 1 (leave it out for no limit)",
                ));
            }
            if entry.tokens_per_day == Some(0) {
                return Err(problem(
                    "tokensPerDay must be at least 1 (leave it out for no limit)",
                ));
            }
            let limits = TenantLimits {
                max_running_turns: entry.max_running_turns,
                tokens_per_day: entry.tokens_per_day,
            };
            if by_id.insert(entry.id.clone(), limits).is_some() {
                return Err(problem("the id is defined twice"));
            }
        }
        Ok(Self { by_id })
    }

    /// Tenants from `(id, limits)` pairs (tests, and deployments built in code).
    pub fn from_limits<'a>(pairs: impl IntoIterator<Item = (&'a str, TenantLimits)>) -> Self {
        Self {
            by_id: pairs
                .into_iter()
                .map(|(id, l)| (id.to_string(), l))
                .collect(),
        }
    }

    /// The limits of `tenant` (none when it is not in the file).
    pub fn limits(&self, tenant: &str) -> TenantLimits {
        self.by_id.get(tenant).copied().unwrap_or_default()
    }

    /// Whether `tenant` is in the file.
    pub fn is_configured(&self, tenant: &str) -> bool {
        self.by_id.contains_key(tenant)
    }

    /// Every configured tenant with its limits, by id.
    pub fn iter(&self) -> impl Iterator<Item = (&str, TenantLimits)> {
        self.by_id.iter().map(|(id, l)| (id.as_str(), *l))
    }

    /// The tenants whose running turns are capped, with their caps.
    pub fn capped(&self) -> impl Iterator<Item = (&str, u32)> {
        self.iter()
            .filter_map(|(id, l)| l.max_running_turns.map(|n| (id, n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_of_the_documented_shape_is_read() {
        let t = Tenants::parse(
            r#"{"tenants":[{"id":"acme","maxRunningTurns":8,"tokensPerDay":2000},{"id":"b.c-d_e"}]}"#,
        )
        .unwrap();
        assert_eq!(
            t.limits("acme"),
            TenantLimits {
                max_running_turns: Some(8),
                tokens_per_day: Some(2000)
            }
        );
        assert_eq!(t.limits("b.c-d_e"), TenantLimits::default());
        assert!(t.is_configured("b.c-d_e"));
        assert_eq!(t.limits("nobody"), TenantLimits::default());
        assert!(!t.is_configured("nobody"));
        assert_eq!(t.capped().collect::<Vec<_>>(), vec![("acme", 8)]);
    }

    #[test]
    fn the_example_file_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tenants.json");
        let t = Tenants::load(&path).unwrap();
        assert_eq!(t.capped().count(), 2);
        assert_eq!(t.limits("trial").tokens_per_day, Some(50_000));
    }

    #[test]
    fn every_broken_rule_names_its_entry() {
        let cases = [
            (
                r#"{"tenants":[{"id":"a b"}]}"#,
                r#"tenants[0] ("a b"): an id is"#,
            ),
            (
                r#"{"tenants":[{"id":"a"},{"id":"a"}]}"#,
                r#"tenants[1] ("a"): the id is defined twice"#,
            ),
            (
                r#"{"tenants":[{"id":"a","maxRunningTurns":0}]}"#,
                "maxRunningTurns must be at least 1",
            ),
            (
                r#"{"tenants":[{"id":"a","tokensPerDay":0}]}"#,
                "tokensPerDay must be at least 1",
            ),
            (
                r#"{"tenants":[{"id":"a","maxRunning":3}]}"#,
                "unknown field `maxRunning`",
            ),
            (r#"{"tenants":[{"id":""}]}"#, "an id is 1 to 64"),
            (
                &format!(r#"{{"tenants":[{{"id":"{}"}}]}}"#, "x".repeat(65)),
                "an id is 1 to 64",
            ),
        ];
        for (text, expected) in cases {
            let e = Tenants::parse(text).unwrap_err().to_string();
            assert!(e.contains(expected), "{text}: {e}");
        }
    }
}
