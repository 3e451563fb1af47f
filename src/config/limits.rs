//! `[limits]`: the largest requests and batches accepted, and the tenants' quotas.

use std::path::Path;

use super::ConfigError;
use super::setting::{Default, Kind, Reader, Setting};
use crate::causes::with_causes;
use crate::contract::RequestLimits;
use crate::tenants::Tenants;

macro_rules! bytes_setting {
    ($name:ident, $var:literal, $key:literal, $default:literal, $about:literal) => {
        #[doc = concat!("`", $var, "`.")]
        pub static $name: Setting = Setting {
            var: $var,
            key: $key,
            aliases: &[],
            kind: Kind::Number,
            default: Default::Value($default),
            about: $about,
        };
    };
}

bytes_setting!(
    MAX_BODY_BYTES,
    "APTIX_MAX_BODY_BYTES",
    "limits.max_body_bytes",
    "16777216",
    "the largest request body accepted (`PAYLOAD_TOO_LARGE`, HTTP 413)"
);
bytes_setting!(
    MAX_INSTRUCTION_BYTES,
    "APTIX_MAX_INSTRUCTION_BYTES",
    "limits.max_instruction_bytes",
    "262144",
    "the largest instruction"
);
bytes_setting!(
    MAX_ARTIFACT_BYTES,
    "APTIX_MAX_ARTIFACT_BYTES",
    "limits.max_artifact_bytes",
    "2097152",
    "the largest input artifact, after base64 decoding"
);
bytes_setting!(
    MAX_IMAGE_BYTES,
    "APTIX_MAX_IMAGE_BYTES",
    "limits.max_image_bytes",
    "8388608",
    "the largest clipboard image, after base64 decoding"
);
bytes_setting!(
    MAX_BATCH_BYTES,
    "APTIX_MAX_BATCH_BYTES",
    "limits.max_batch_bytes",
    "67108864",
    "the largest `POST /v1/batches` body (HTTP 413)"
);
bytes_setting!(
    MAX_BATCH_LINES,
    "APTIX_MAX_BATCH_LINES",
    "limits.max_batch_lines",
    "10000",
    "the most lines in one batch (HTTP 413)"
);

/// `APTIX_TENANTS_FILE`.
pub static TENANTS_FILE: Setting = Setting {
    var: "APTIX_TENANTS_FILE",
    key: "limits.tenants_file",
    aliases: &[],
    kind: Kind::Path,
    default: Default::Unset,
    about: "tenants' `maxRunningTurns`, `tokensPerDay` and `costPerDay` (JSON, see \
            docs/operations.md), read and checked at start-up; every process must read the same",
};

/// The settings of this section.
pub static SETTINGS: &[&Setting] = &[
    &MAX_BODY_BYTES,
    &MAX_INSTRUCTION_BYTES,
    &MAX_ARTIFACT_BYTES,
    &MAX_IMAGE_BYTES,
    &MAX_BATCH_BYTES,
    &MAX_BATCH_LINES,
    &TENANTS_FILE,
];

/// Limits of one batch submission (each line is also held to [`RequestLimits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// The largest NDJSON body, in bytes.
    pub max_bytes: usize,
    /// The most lines.
    pub max_lines: usize,
}

impl std::default::Default for BatchLimits {
    fn default() -> Self {
        Self {
            max_bytes: 64 * 1024 * 1024,
            max_lines: 10_000,
        }
    }
}

/// `[limits]`.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Request size limits.
    pub request: RequestLimits,
    /// The largest batch submission.
    pub batch: BatchLimits,
    /// Tenants' quotas.
    pub tenants: Tenants,
}

impl Limits {
    /// Reads the section.
    pub fn read(r: &Reader) -> Result<Self, ConfigError> {
        Ok(Self {
            request: RequestLimits {
                max_body_bytes: r.positive(&MAX_BODY_BYTES)?,
                max_instruction_bytes: r.positive(&MAX_INSTRUCTION_BYTES)?,
                max_artifact_bytes: r.positive(&MAX_ARTIFACT_BYTES)?,
                max_image_bytes: r.positive(&MAX_IMAGE_BYTES)?,
            },
            batch: BatchLimits {
                max_bytes: r.positive(&MAX_BATCH_BYTES)?,
                max_lines: r.positive(&MAX_BATCH_LINES)?,
            },
            tenants: r
                .parse(&TENANTS_FILE, |path, _| {
                    Tenants::load(Path::new(path)).map_err(|e| with_causes(&e))
                })?
                .unwrap_or_default(),
        })
    }
}
