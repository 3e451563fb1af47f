//! API tokens (`APTIX_API_TOKENS`): whom each bearer token stands for — a tenant, and whether
//! it is an admin token. Debug output shows tenants only: tokens are secrets.
//!
//! Owns: the tokens' written form and lookup. Must not: read the environment (configuration
//! does) or decide what a caller may do (the routes do).

/// Bearer tokens and whom they stand for; debug output shows tenants only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ApiTokens(std::collections::HashMap<String, Caller>);

/// Whom a bearer token stands for: a tenant, and whether it is an admin token (written
/// `token=tenant:admin`), which may also read every tenant's sessions, turns and batches and
/// the system's state (the console's system pages, `/v1/admin/…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The tenant whose turns the token submits.
    pub tenant: String,
    /// May read every tenant's work and the system's.
    pub admin: bool,
}

/// The mark after a tenant that makes its token an admin token.
const ADMIN_MARK: &str = ":admin";

impl ApiTokens {
    /// Tokens from their written form, `token=tenant[:admin],…` (`APTIX_API_TOKENS`). An
    /// error says what is wrong without echoing the entry (it holds a secret).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = std::collections::HashMap::new();
        for pair in text.split(',') {
            let pair = pair.trim();
            if pair.is_empty() {
                continue;
            }
            match pair.split_once('=') {
                Some((token, tenant)) if !token.trim().is_empty() && !tenant.trim().is_empty() => {
                    let tenant = tenant.trim();
                    let (tenant, admin) = match tenant.strip_suffix(ADMIN_MARK) {
                        Some(t) => (t.trim(), true),
                        None => (tenant, false),
                    };
                    if tenant.is_empty() {
                        return Err(
                            "an admin entry must name its tenant: token=tenant:admin".into()
                        );
                    }
                    // A tenant's name scopes its session ids in keys and queue names.
                    if let Err(e) = crate::contract::ids::check_tenant(tenant) {
                        return Err(format!("tenant {tenant:?}: {e}"));
                    }
                    let caller = Caller {
                        tenant: tenant.to_string(),
                        admin,
                    };
                    out.insert(token.trim().to_string(), caller);
                }
                // The entry is not echoed: it holds a secret.
                _ => {
                    return Err("every entry must be token=tenant".into());
                }
            }
        }
        Ok(Self(out))
    }

    /// Tokens from `(token, tenant)` pairs (none of them admin).
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        Self(
            pairs
                .into_iter()
                .map(|(token, tenant)| {
                    (
                        token,
                        Caller {
                            tenant,
                            admin: false,
                        },
                    )
                })
                .collect(),
        )
    }
    /// These tokens and `token`, an admin token of `tenant`.
    pub fn with_admin(mut self, token: impl Into<String>, tenant: impl Into<String>) -> Self {
        self.0.insert(
            token.into(),
            Caller {
                tenant: tenant.into(),
                admin: true,
            },
        );
        self
    }
    /// The tenant a token stands for.
    pub fn tenant(&self, token: &str) -> Option<&str> {
        self.0.get(token).map(|c| c.tenant.as_str())
    }
    /// Whom a token stands for.
    pub fn caller(&self, token: &str) -> Option<&Caller> {
        self.0.get(token)
    }
    /// Whether no tokens are configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The tenants the tokens stand for, sorted, each once.
    pub fn tenants(&self) -> Vec<&str> {
        let set: std::collections::BTreeSet<&str> =
            self.0.values().map(|c| c.tenant.as_str()).collect();
        set.into_iter().collect()
    }
}

impl std::fmt::Debug for ApiTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut tenants: Vec<&String> = self.0.values().map(|c| &c.tenant).collect();
        tenants.sort();
        write!(f, "ApiTokens(tenants: {tenants:?})")
    }
}
