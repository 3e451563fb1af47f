//! TLS for RabbitMQ (`amqps://`), Redis (`rediss://`) and the model endpoint: one crypto
//! provider (ring), installed explicitly at start-up, and an optional extra CA bundle
//! (`APTIX_TLS_CA_FILE`) trusted in addition to the system's roots.
//!
//! Owns: loading and checking the CA bundle, the provider. Must not: open connections.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;

/// Installs the process's one rustls crypto provider. Idempotent; call before any TLS
/// connection is made (the binary does it first thing).
pub fn install_crypto_provider() {
    // Err means one is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A reqwest client builder that trusts `ca` in addition to the system's roots (webhooks, MCP
/// servers, the span exporter start from it). It speaks HTTP/1.1 only: the model client is the
/// one place HTTP/2 is spoken (`model.http`, `llm::ModelHttp`), from [`client_builder`].
pub fn http_client_builder(ca: Option<&ExtraCa>) -> Result<reqwest::ClientBuilder, reqwest::Error> {
    Ok(client_builder(ca)?.http1_only())
}

/// [`http_client_builder`] before a version is chosen: as built, its client offers HTTP/2 and
/// HTTP/1.1 by ALPN on `https://` and speaks HTTP/1.1 on `http://`.
pub fn client_builder(ca: Option<&ExtraCa>) -> Result<reqwest::ClientBuilder, reqwest::Error> {
    install_crypto_provider();
    let mut builder = reqwest::Client::builder();
    if let Some(ca) = ca {
        for cert in reqwest::Certificate::from_pem_bundle(ca.pem().as_bytes())? {
            builder = builder.add_root_certificate(cert);
        }
    }
    Ok(builder)
}

/// A rustls client set-up that trusts the system's roots and `ca`, for the connections the
/// model client opens itself (`llm::h2conn`); ALPN is the caller's to set.
pub fn client_config(ca: Option<&ExtraCa>) -> rustls::ClientConfig {
    install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (_added, _unusable) = roots.add_parsable_certificates(native.certs);
    if let Some(ca) = ca {
        let extra = CertificateDer::pem_slice_iter(ca.pem().as_bytes()).filter_map(Result::ok);
        let (_added, _unusable) = roots.add_parsable_certificates(extra);
    }
    rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// A CA bundle file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// The file cannot be read.
    #[error("cannot read the CA bundle {}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a bundle of certificates.
    #[error("the CA bundle {} {problem}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with its text.
        problem: PemProblem,
    },
}

/// What is wrong with a PEM text that should hold certificates.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PemProblem {
    /// A block could not be read.
    #[error("is not a PEM certificate bundle ({0})")]
    NotPem(String),
    /// No certificate in it.
    #[error("holds no PEM certificate")]
    NoCertificate,
}

/// Extra trusted CA certificates, as PEM text (checked to hold at least one certificate).
#[derive(Clone, PartialEq, Eq)]
pub struct ExtraCa {
    pem: String,
    count: usize,
}

impl std::fmt::Debug for ExtraCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ExtraCa({} certificate(s))", self.count)
    }
}

impl ExtraCa {
    /// Reads a PEM bundle; an unreadable file, or one with no certificate, is an error that
    /// names the file.
    pub fn load(path: &Path) -> Result<Self, CaError> {
        let pem = std::fs::read_to_string(path).map_err(|source| CaError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_pem(&pem).map_err(|problem| CaError::Invalid {
            path: path.to_path_buf(),
            problem,
        })
    }

    /// A bundle from PEM text.
    pub fn from_pem(pem: &str) -> Result<Self, PemProblem> {
        let mut count = 0;
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            cert.map_err(|e| PemProblem::NotPem(format!("{e:?}")))?;
            count += 1;
        }
        if count == 0 {
            return Err(PemProblem::NoCertificate);
        }
        Ok(Self {
            pem: pem.to_string(),
            count,
        })
    }

    /// The bundle as PEM text.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The system's trusted roots followed by this bundle, as PEM: for clients that take one
    /// root list instead of adding to the system's (redis-rs).
    pub fn with_system_roots(&self) -> String {
        let mut out = String::new();
        for cert in rustls_native_certs::load_native_certs().certs {
            out.push_str("-----BEGIN CERTIFICATE-----\n");
            let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
            for line in b64.as_bytes().chunks(64) {
                out.push_str(&String::from_utf8_lossy(line));
                out.push('\n');
            }
            out.push_str("-----END CERTIFICATE-----\n");
        }
        out.push_str(&self.pem);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::ExtraCa;

    #[test]
    fn a_bundle_without_certificates_is_refused() {
        assert!(ExtraCa::from_pem("").is_err());
        assert!(ExtraCa::from_pem("not pem at all").is_err());
        let err = ExtraCa::load(std::path::Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
        assert!(
            std::error::Error::source(&err).is_some(),
            "the I/O cause is kept"
        );
    }
}
