//! The layers configuration is read from: the environment over an optional TOML file
//! (`APTIX_CONFIG_FILE`).
//!
//! Why TOML: its tables are our sections one to one (`[model]`, `[broker]`), it has comments,
//! and its values are typed without guessing (YAML reads `no` as false and `1.10` as a number;
//! its maintained Rust parsers are few). Every value is read back as text, so a file value and
//! the variable it stands for go through the same parser and the same errors.
//!
//! Owns: reading the file once, refusing keys no setting has, and the environment lookup
//! (blank values count as unset). Must not: interpret values.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::ConfigError;

/// The variable naming the configuration file.
pub const FILE_VAR: &str = "APTIX_CONFIG_FILE";

type Lookup<'a> = Box<dyn Fn(&str) -> Option<String> + Send + Sync + 'a>;

/// The layers: environment variables and, under them, the configuration file.
pub struct Sources<'a> {
    env: Lookup<'a>,
    file: Option<FileLayer>,
}

impl std::fmt::Debug for Sources<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field("file", &self.file.as_ref().map(|f| &f.path))
            .finish_non_exhaustive()
    }
}

/// The configuration file's values, by `section.key`, as text.
#[derive(Debug, Clone)]
struct FileLayer {
    path: PathBuf,
    values: BTreeMap<String, String>,
}

impl Sources<'static> {
    /// The process environment and the file it names.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }
}

impl<'a> Sources<'a> {
    /// Variables through `lookup` (tests pass a map) and the file `APTIX_CONFIG_FILE` names.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'a,
    ) -> Result<Self, ConfigError> {
        let mut sources = Self {
            env: Box::new(lookup),
            file: None,
        };
        if let Some(path) = sources.env(FILE_VAR) {
            sources.file = Some(FileLayer::read(Path::new(&path))?);
        }
        Ok(sources)
    }

    /// A variable's value, trimmed; blank counts as unset.
    pub fn env(&self, var: &str) -> Option<String> {
        (self.env)(var)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// A variable's value exactly as set (for secrets that files name by variable).
    pub fn env_raw(&self, var: &str) -> Option<String> {
        (self.env)(var)
    }

    /// The file's value under `key` (`section.key`), trimmed; blank counts as unset.
    pub fn file(&self, key: &str) -> Option<String> {
        self.file
            .as_ref()
            .and_then(|f| f.values.get(key))
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// The file's path for messages (`APTIX_CONFIG_FILE` when there is none).
    pub fn file_name(&self) -> String {
        match &self.file {
            Some(f) => f.path.display().to_string(),
            None => FILE_VAR.to_string(),
        }
    }

    /// The file's path, if one is read.
    pub fn file_path(&self) -> Option<&Path> {
        self.file.as_ref().map(|f| f.path.as_path())
    }
}

impl FileLayer {
    fn read(path: &Path) -> Result<Self, ConfigError> {
        let problem = |p: String| ConfigError {
            var: FILE_VAR,
            problem: format!("{}: {p}", path.display()),
        };
        let text = std::fs::read_to_string(path).map_err(|e| problem(e.to_string()))?;
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| problem(format!("not TOML: {}", e.message())))?;
        let mut values = BTreeMap::new();
        for (name, value) in table {
            match value {
                toml::Value::Table(section) => {
                    for (key, value) in section {
                        let key = format!("{name}.{key}");
                        let text = as_text(&key, value).map_err(problem)?;
                        values.insert(key, text);
                    }
                }
                value => {
                    let text = as_text(&name, value).map_err(problem)?;
                    values.insert(name, text);
                }
            }
        }
        if let Some(unknown) = values.keys().find(|k| super::setting_by_key(k).is_none()) {
            let section = unknown.split_once('.').map_or("", |(s, _)| s);
            let known: Vec<&str> = super::ALL
                .iter()
                .flat_map(|group| group.iter())
                .map(|s| s.key)
                .filter(|k| k.split_once('.').map_or("", |(s, _)| s) == section)
                .collect();
            return Err(problem(format!(
                "no setting is called {unknown:?} (known here: {})",
                if known.is_empty() {
                    let sections: Vec<&str> = super::ALL
                        .iter()
                        .filter_map(|group| group.first()?.key.split_once('.'))
                        .map(|(section, _)| section)
                        .collect();
                    format!("none; the sections are {}", sections.join(", "))
                } else {
                    known.join(", ")
                }
            )));
        }
        Ok(Self {
            path: path.to_path_buf(),
            values,
        })
    }
}

/// A file value as the text its variable would hold: lists comma-separated.
fn as_text(key: &str, value: toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(s) => Ok(s),
        toml::Value::Integer(n) => Ok(n.to_string()),
        toml::Value::Float(x) => Ok(x.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                toml::Value::Array(_) | toml::Value::Table(_) => {
                    Err(format!("{key}: a list holds plain values"))
                }
                item => as_text(key, item),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|items| items.join(",")),
        toml::Value::Datetime(_) | toml::Value::Table(_) => Err(format!(
            "{key}: not a value this file takes (text, number, flag or list)"
        )),
    }
}
