//! `[tools]`: the MCP servers a worker plugs in as server tools (the tools file) and where
//! they may be reached.

use std::path::Path;

use super::ConfigError;
use super::setting::{Default, Kind, Reader, Setting};
use crate::causes::with_causes;
use crate::mcp::ToolSources;
use crate::webhooks::guard::{Allowed, Guard};

/// `APTIX_TOOLS_FILE`.
pub static FILE: Setting = Setting {
    var: "APTIX_TOOLS_FILE",
    key: "tools.file",
    aliases: &[],
    kind: Kind::Path,
    default: Default::Unset,
    about: "the MCP servers whose tools the agent may call as server tools (JSON, see \
            docs/tools.md), read and checked at start-up; without it only the built-in tools",
};

/// `APTIX_TOOLS_ALLOW`.
pub static ALLOW: Setting = Setting {
    var: "APTIX_TOOLS_ALLOW",
    key: "tools.allow",
    aliases: &[],
    kind: Kind::Text,
    default: Default::Unset,
    about: "host names and address ranges (comma-separated) an MCP server URL may point at \
            although they are not public (internal tool servers)",
};

/// `APTIX_TOOLS_ALLOW_HTTP`.
pub static ALLOW_HTTP: Setting = Setting {
    var: "APTIX_TOOLS_ALLOW_HTTP",
    key: "tools.allow_http",
    aliases: &[],
    kind: Kind::Flag,
    default: Default::Value("false"),
    about: "`http` MCP server URLs are accepted too (a server on the same host or network)",
};

/// The settings of this section.
pub static SETTINGS: &[&Setting] = &[&FILE, &ALLOW, &ALLOW_HTTP];

/// `[tools]`.
#[derive(Debug, Clone, Default)]
pub struct Tools {
    /// The MCP sources (none without a tools file).
    pub sources: ToolSources,
    /// Where their URLs may point.
    pub guard: Guard,
}

impl Tools {
    /// Reads the section (and the tools file, whose header values come from the environment).
    pub fn read(r: &Reader) -> Result<Self, ConfigError> {
        let sources = r
            .parse(&FILE, |path, _| {
                ToolSources::load(Path::new(path), |k| r.sources().env_raw(k))
                    .map_err(|e| with_causes(&e))
            })?
            .unwrap_or_default();
        let guard = Guard::new(
            r.flag(&ALLOW_HTTP)?,
            r.parse(&ALLOW, |t, _| t.parse::<Allowed>())?
                .unwrap_or_default(),
        );
        for (i, s) in sources.sources.iter().enumerate() {
            if let crate::mcp::sources::Transport::Http { url, .. } = &s.transport {
                guard.parse(url).map_err(|e| ConfigError {
                    var: FILE.var,
                    problem: format!("sources[{i}] ({:?}): the url is refused: {e}", s.name),
                })?;
            }
        }
        Ok(Self { sources, guard })
    }
}
