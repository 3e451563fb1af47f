//! The settings' reference, generated from their declarations (`aptix config --reference`;
//! `docs/configuration.md` holds a copy a test keeps current), and the effective configuration
//! as `aptix config` prints it.

use std::fmt::Write as _;

use super::setting::{Default, Kind, Unit};
use super::{ALL, Config, Setting};

/// The Markdown reference: one table per section.
pub fn markdown() -> String {
    let mut out = String::new();
    for group in ALL {
        match group.first().and_then(|s| s.key.split_once('.')) {
            Some((section, _)) => {
                let _ = writeln!(out, "### `[{section}]`\n");
            }
            None => out.push_str("### Top level (no section)\n\n"),
        }
        out.push_str("| variable | file key | default | meaning |\n|---|---|---|---|\n");
        for s in group.iter() {
            let _ = writeln!(
                out,
                "| `{}`{} | `{}` | {} | {}{} |",
                s.var,
                aliases(s),
                s.key,
                default(s),
                kind(s.kind),
                s.about.replace('|', "\\|"),
            );
        }
        out.push('\n');
    }
    out
}

fn aliases(s: &Setting) -> String {
    s.aliases
        .iter()
        .map(|a| match a.unit {
            Some(Unit::Seconds) => format!("<br>or `{}` (seconds)", a.var),
            Some(Unit::Millis) => format!("<br>or `{}` (milliseconds)", a.var),
            None => format!("<br>or `{}`", a.var),
        })
        .collect()
}

fn default(s: &Setting) -> String {
    match s.default {
        Default::Value(v) => format!("`{v}`"),
        Default::Unset => "unset".to_string(),
        Default::Computed(how) => how.to_string(),
    }
}

fn kind(k: Kind) -> String {
    match k {
        Kind::Duration => "(duration) ".to_string(),
        Kind::Durations => "(durations, comma-separated) ".to_string(),
        Kind::Flag => "(flag) ".to_string(),
        Kind::Secret => "(secret, never printed) ".to_string(),
        Kind::SecretUrls => "(credentials never printed) ".to_string(),
        Kind::Choice(words) => format!("(one of {}) ", words.join(", ")),
        Kind::Text | Kind::Number | Kind::Path => String::new(),
    }
}

/// The effective configuration: every setting, its value (secrets masked) and where it came
/// from, one per line, aligned.
pub fn effective(config: &Config) -> String {
    let rows: Vec<(&str, String, String)> = ALL
        .iter()
        .flat_map(|group| group.iter())
        .filter_map(|s| {
            config
                .effective()
                .iter()
                .find(|e| std::ptr::eq(e.setting, *s))
                .map(|e| (s.key, e.shown(), e.origin.to_string()))
        })
        .collect();
    let key_width = rows.iter().map(|(k, ..)| k.len()).max().unwrap_or(0);
    let value_width = rows
        .iter()
        .map(|(_, v, _)| v.len())
        .max()
        .unwrap_or(0)
        .min(48);
    let mut out = String::new();
    for (key, value, origin) in rows {
        let _ = writeln!(out, "{key:key_width$}  {value:value_width$}  ({origin})");
    }
    out
}
