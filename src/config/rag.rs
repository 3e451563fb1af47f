//! `[rag]`: how much retrieved context a turn gets and how documents are chunked.

use super::ConfigError;
use super::setting::{Default, Kind, Reader, Setting};

/// `APTIX_RAG_MAX_CHUNKS`.
pub static MAX_CHUNKS: Setting = Setting {
    var: "APTIX_RAG_MAX_CHUNKS",
    key: "rag.max_chunks",
    aliases: &[],
    kind: Kind::Number,
    default: Default::Value("8"),
    about: "the most retrieved chunks in one turn's `[CONTEXT]` block (`0` turns retrieval off)",
};

/// `APTIX_RAG_MAX_CHARS`.
pub static MAX_CHARS: Setting = Setting {
    var: "APTIX_RAG_MAX_CHARS",
    key: "rag.max_chars",
    aliases: &[],
    kind: Kind::Number,
    default: Default::Value("24000"),
    about: "the most characters of chunk text in the block; the request's own artifacts count but \
            are never cut",
};

/// `APTIX_RAG_CHUNK_LINES`.
pub static CHUNK_LINES: Setting = Setting {
    var: "APTIX_RAG_CHUNK_LINES",
    key: "rag.chunk_lines",
    aliases: &[],
    kind: Kind::Number,
    default: Default::Value("60"),
    about: "the most lines in one indexed chunk",
};

/// The settings of this section.
pub static SETTINGS: &[&Setting] = &[&MAX_CHUNKS, &MAX_CHARS, &CHUNK_LINES];

/// `[rag]`.
#[derive(Debug, Clone)]
pub struct Rag {
    /// How much retrieved context a turn gets.
    pub budget: crate::rag::RagBudget,
    /// The most lines in one indexed chunk.
    pub chunk_lines: usize,
}

impl Rag {
    /// Reads the section.
    pub fn read(r: &Reader) -> Result<Self, ConfigError> {
        Ok(Self {
            budget: crate::rag::RagBudget {
                max_chunks: r.number(&MAX_CHUNKS)?,
                max_chars: r.number(&MAX_CHARS)?,
            },
            chunk_lines: r.positive(&CHUNK_LINES)?,
        })
    }
}
