//! Where a webhook may point: no server-side request forgery. A URL must be `https` (`http`
//! only when the setting allows it), carry no credentials, and reach public addresses only —
//! loopback, private, link-local (cloud metadata at 169.254.169.254), shared, documentation,
//! multicast and reserved ranges are refused — unless the allow-list (`APTIX_WEBHOOK_ALLOW`)
//! names the host or a range holding the address. Checked at submission and again at every
//! delivery: the delivery client resolves names through [`Guard`] itself, so the address it
//! connects to is the one that was checked (a name that resolves elsewhere later, DNS
//! rebinding, gains nothing).
//!
//! Owns: that policy. Must not: send anything.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::Url;

/// The longest URL accepted.
pub const MAX_URL_BYTES: usize = crate::contract::request::MAX_WEBHOOK_URL_BYTES;

/// An address range (`10.0.0.0/8`, `fd00::/8`, or one address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    base: IpAddr,
    prefix: u8,
}

impl Range {
    fn parse(text: &str) -> Option<Self> {
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p.parse::<u8>().ok()?)),
            None => (text, None),
        };
        let base: IpAddr = addr.parse().ok()?;
        let max = if base.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        (prefix <= max).then_some(Self { base, prefix })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let bits = |ip: IpAddr| -> (u128, u8) {
            match ip {
                IpAddr::V4(v4) => (u128::from(u32::from(v4)) << 96, 32),
                IpAddr::V6(v6) => (u128::from(v6), 128),
            }
        };
        let ((base, base_len), (addr, addr_len)) = (bits(self.base), bits(ip));
        if base_len != addr_len {
            return false;
        }
        if self.prefix == 0 {
            return true;
        }
        let mask = u128::MAX << (128 - u32::from(self.prefix));
        base & mask == addr & mask
    }
}

/// What the allow-list names: host names and address ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowed {
    hosts: Vec<String>,
    ranges: Vec<Range>,
}

impl std::str::FromStr for Allowed {
    type Err = String;
    /// A comma-separated list of host names and address ranges.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut allowed = Self::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if let Some(range) = Range::parse(item) {
                allowed.ranges.push(range);
            } else if item.contains('/') || item.contains(' ') {
                return Err(format!(
                    "{item:?} is neither a host name nor an address range"
                ));
            } else {
                allowed.hosts.push(item.to_ascii_lowercase());
            }
        }
        Ok(allowed)
    }
}

/// Why a webhook URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not an absolute URL with a host.
    #[error("{0}")]
    Malformed(String),
    /// Not `https` (or `http` where allowed).
    #[error("the scheme must be https{}", if *.allow_http { " or http" } else { "" })]
    Scheme {
        /// Whether `http` was allowed.
        allow_http: bool,
    },
    /// The host name does not resolve.
    #[error("{host} does not resolve: {error}")]
    Unresolved {
        /// The host.
        host: String,
        /// What the resolver said.
        error: String,
    },
    /// The host is, or resolves to, an address that is not public.
    #[error("{host} is {addr}, which is not a public address (APTIX_WEBHOOK_ALLOW can allow it)")]
    NotPublic {
        /// The host.
        host: String,
        /// The address.
        addr: IpAddr,
    },
}

/// The policy, shared by the front door (submission) and the delivery client (its resolver).
#[derive(Debug, Clone, Default)]
pub struct Guard {
    allow_http: bool,
    allowed: Allowed,
}

impl Guard {
    /// A policy: `http` URLs too when `allow_http`; non-public hosts and ranges in `allowed`.
    pub fn new(allow_http: bool, allowed: Allowed) -> Self {
        Self {
            allow_http,
            allowed,
        }
    }

    /// Checks what can be checked without the network: a URL, its scheme, no credentials,
    /// a host; an address literal must be allowed.
    pub fn parse(&self, url: &str) -> Result<Url, Refused> {
        if url.len() > MAX_URL_BYTES {
            return Err(Refused::Malformed(format!(
                "is {} bytes; the limit is {MAX_URL_BYTES}",
                url.len()
            )));
        }
        let parsed =
            Url::parse(url).map_err(|e| Refused::Malformed(format!("is not a URL: {e}")))?;
        match parsed.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            _ => {
                return Err(Refused::Scheme {
                    allow_http: self.allow_http,
                });
            }
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(Refused::Malformed(
                "carries credentials; put them in the receiver's secret instead".into(),
            ));
        }
        let Some(host) = parsed.host_str() else {
            return Err(Refused::Malformed("has no host".into()));
        };
        let literal = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>();
        if let Ok(addr) = literal {
            self.admit(host, addr)?;
        }
        Ok(parsed)
    }

    /// Parses `url` and resolves its host, every address of which must be admitted.
    pub async fn check(&self, url: &str) -> Result<Url, Refused> {
        let parsed = self.parse(url)?;
        if let Some(host) = parsed.host_str() {
            let port = parsed.port_or_known_default().unwrap_or(443);
            self.resolve(host, port).await?;
        }
        Ok(parsed)
    }

    /// The addresses of `host` at `port`, each admitted (any that is not refuses the host).
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, Refused> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| Refused::Unresolved {
                host: host.to_string(),
                error: e.to_string(),
            })?
            .collect();
        if addrs.is_empty() {
            return Err(Refused::Unresolved {
                host: host.to_string(),
                error: "no addresses".into(),
            });
        }
        for a in &addrs {
            self.admit(host, a.ip())?;
        }
        Ok(addrs)
    }

    fn admit(&self, host: &str, addr: IpAddr) -> Result<(), Refused> {
        let named =
            self.allowed.hosts.iter().any(|h| {
                h.eq_ignore_ascii_case(host.trim_start_matches('[').trim_end_matches(']'))
            });
        if named || is_public(addr) || self.allowed.ranges.iter().any(|r| r.contains(addr)) {
            Ok(())
        } else {
            Err(Refused::NotPublic {
                host: host.to_string(),
                addr,
            })
        }
    }
}

/// The delivery client's resolver: names resolve through the policy, so the client connects
/// only to admitted addresses.
impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = self.clone();
        Box::pin(async move {
            // Port 0: reqwest puts the URL's port in.
            let addrs = guard
                .resolve(name.as_str(), 0)
                .await
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Whether `ip` is a public unicast address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    const NOT_PUBLIC: [(u32, u8); 15] = [
        (0x0000_0000, 8),  // "this" network
        (0x0A00_0000, 8),  // private
        (0x6440_0000, 10), // shared address space (carrier-grade NAT)
        (0x7F00_0000, 8),  // loopback
        (0xA9FE_0000, 16), // link-local (cloud metadata)
        (0xAC10_0000, 12), // private
        (0xC000_0000, 24), // IETF protocol assignments
        (0xC000_0200, 24), // documentation
        (0xC058_6300, 24), // 6to4 relay anycast
        (0xC0A8_0000, 16), // private
        (0xC612_0000, 15), // benchmarking
        (0xC633_6400, 24), // documentation
        (0xCB00_7100, 24), // documentation
        (0xE000_0000, 4),  // multicast
        (0xF000_0000, 4),  // reserved, broadcast
    ];
    let bits = u32::from(ip);
    !NOT_PUBLIC
        .iter()
        .any(|(base, len)| bits & (u32::MAX << (32 - u32::from(*len))) == *base)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let bits = u128::from(ip);
    const NOT_PUBLIC: [(u128, u8); 8] = [
        (0, 127),                     // unspecified, loopback
        (0x0064_ff9b_0001 << 80, 48), // local-use NAT64
        (0x0100 << 112, 64),          // discard-only
        (0x2001_0db8 << 96, 32),      // documentation
        (0xfc00 << 112, 7),           // unique local
        (0xfe80 << 112, 10),          // link-local
        (0xff00 << 112, 8),           // multicast
        (0x2001 << 112, 23),          // IETF protocol assignments
    ];
    !NOT_PUBLIC
        .iter()
        .any(|(base, len)| bits & (u128::MAX << (128 - u32::from(*len))) == *base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(allow_http: bool, allowed: &str) -> Guard {
        Guard::new(allow_http, allowed.parse().unwrap())
    }

    #[test]
    fn only_public_unicast_addresses_are_public() {
        for ip in ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(is_public(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.2.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "2001:db8::1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
        assert!(is_public("172.32.0.1".parse().unwrap()));
    }

    #[test]
    fn urls_are_https_without_credentials_and_literal_addresses_must_be_public() {
        let g = guard(false, "");
        assert!(g.parse("https://hooks.example.com/aptix?x=1").is_ok());
        assert_eq!(
            g.parse("http://hooks.example.com/").unwrap_err(),
            Refused::Scheme { allow_http: false }
        );
        assert!(guard(true, "").parse("http://hooks.example.com/").is_ok());
        assert!(matches!(
            g.parse("ftp://hooks.example.com/").unwrap_err(),
            Refused::Scheme { .. }
        ));
        assert!(matches!(
            g.parse("https://user:pw@hooks.example.com/").unwrap_err(),
            Refused::Malformed(_)
        ));
        assert!(matches!(
            g.parse("not a url").unwrap_err(),
            Refused::Malformed(_)
        ));
        for url in [
            "https://127.0.0.1/",
            "https://169.254.169.254/latest/meta-data/",
            "https://10.0.0.5:8443/",
            "https://[::1]/",
            "https://[::ffff:127.0.0.1]/",
        ] {
            assert!(
                matches!(g.parse(url).unwrap_err(), Refused::NotPublic { .. }),
                "{url}"
            );
        }
        let long = format!("https://e.com/{}", "a".repeat(MAX_URL_BYTES));
        assert!(matches!(g.parse(&long).unwrap_err(), Refused::Malformed(_)));
    }

    #[test]
    fn the_allow_list_names_hosts_and_ranges() {
        let g = guard(true, "127.0.0.0/8, hooks.internal, fd00::/8");
        assert!(g.parse("http://127.0.0.1:9000/").is_ok());
        assert!(g.parse("https://[fd00::5]/").is_ok());
        assert!(matches!(
            g.parse("https://10.0.0.1/").unwrap_err(),
            Refused::NotPublic { .. }
        ));
        assert!(
            g.admit("hooks.internal", "10.0.0.1".parse().unwrap())
                .is_ok()
        );
        assert!("10.0.0.0/33".parse::<Allowed>().is_err());
        assert!("a b".parse::<Allowed>().is_err());
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_a_private_address_is_refused() {
        let g = guard(true, "");
        let refused = g.check("http://localhost:9/").await.unwrap_err();
        assert!(matches!(refused, Refused::NotPublic { .. }), "{refused}");
        assert!(
            guard(true, "localhost")
                .check("http://localhost:9/")
                .await
                .is_ok()
        );
        assert!(
            guard(true, "127.0.0.0/8, ::1")
                .check("http://localhost:9/")
                .await
                .is_ok()
        );
    }
}
