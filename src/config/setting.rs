//! What one setting is (its variable, file key, older names, default and meaning) and the typed
//! reads every section makes through [`Reader`], which also records where each value came from.
//!
//! Owns: the precedence of the layers (environment over file over default), the one spelling of
//! every kind of value (durations `30s`, flags `true`/`false`, lists comma-separated) and the
//! errors that name the variable. Must not: know any particular setting.

use std::cell::RefCell;
use std::time::Duration;

use super::ConfigError;
use super::source::Sources;

/// One configuration setting.
#[derive(Debug)]
pub struct Setting {
    /// Its environment variable (the name users set).
    pub var: &'static str,
    /// Its key in the configuration file: `section.key`, or `key` for the top level.
    pub key: &'static str,
    /// Older variable names that still work.
    pub aliases: &'static [Alias],
    /// What kind of value it takes.
    pub kind: Kind,
    /// Its value when nothing sets it.
    pub default: Default,
    /// What it does, one sentence or two (the reference prints it).
    pub about: &'static str,
}

/// An older name of a setting.
#[derive(Debug)]
pub struct Alias {
    /// The variable.
    pub var: &'static str,
    /// For a duration, the unit a bare number is in under this name (`_SECS`, `_MS`).
    pub unit: Option<Unit>,
}

/// The unit of a bare number under an older duration variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Seconds (`…_SECS`).
    Seconds,
    /// Milliseconds (`…_MS`).
    Millis,
}

/// The kind of value a setting takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Free text.
    Text,
    /// Text never printed (keys, tokens).
    Secret,
    /// URLs, comma-separated, printed without their credentials.
    SecretUrls,
    /// `true` or `false` (also `1`/`0`, `yes`/`no`, `on`/`off`).
    Flag,
    /// A whole number.
    Number,
    /// A duration: a number and a unit (`500ms`, `30s`, `5m`, `1h`, `7d`).
    Duration,
    /// Durations, comma-separated.
    Durations,
    /// A file's path.
    Path,
    /// One of the listed words.
    Choice(&'static [&'static str]),
}

/// A setting's value when nothing sets it.
#[derive(Debug, Clone, Copy)]
pub enum Default {
    /// This text, read like a value that was set.
    Value(&'static str),
    /// Nothing (the setting is off, or something else is used; `about` says what).
    Unset,
    /// Worked out at start-up; the text says how.
    Computed(&'static str),
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Nobody set it.
    Default,
    /// The configuration file, under the setting's key.
    File,
    /// This environment variable (the setting's or an older name).
    Env(&'static str),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Default => f.write_str("default"),
            Self::File => f.write_str("file"),
            Self::Env(var) => write!(f, "env {var}"),
        }
    }
}

/// One setting's effective value, as `aptix config` prints it.
#[derive(Clone)]
pub struct Effective {
    /// The setting.
    pub setting: &'static Setting,
    /// The value's text (`None`: unset), secrets included: print it through
    /// [`Effective::shown`].
    pub(super) value: Option<String>,
    /// Where it came from.
    pub origin: Origin,
}

impl std::fmt::Debug for Effective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={} ({})", self.setting.var, self.shown(), self.origin)
    }
}

impl Effective {
    /// The value as it may be printed: secrets masked, credentials in URLs hidden.
    pub fn shown(&self) -> String {
        match (&self.value, self.setting.kind) {
            (None, _) => "(unset)".to_string(),
            (Some(_), Kind::Secret) => "****".to_string(),
            (Some(v), Kind::SecretUrls) => v
                .split(',')
                .map(hide_userinfo)
                .collect::<Vec<_>>()
                .join(","),
            (Some(v), _) => v.clone(),
        }
    }
}

/// `scheme://user:password@host/...` → `scheme://****@host/...`.
fn hide_userinfo(url: &str) -> String {
    let url = url.trim();
    let Some((scheme, rest)) = url.split_once("://") else {
        return "****".to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://****@{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// A setting's text and where it came from.
struct Raw {
    text: String,
    origin: Origin,
    /// The unit of a bare number (older duration names).
    unit: Option<Unit>,
}

/// Reads settings from the layers, typed, and records each one's effective value.
pub struct Reader<'a> {
    sources: &'a Sources<'a>,
    effective: RefCell<Vec<Effective>>,
}

impl<'a> Reader<'a> {
    /// A reader of these layers.
    pub fn new(sources: &'a Sources<'a>) -> Self {
        Self {
            sources,
            effective: RefCell::default(),
        }
    }

    /// The effective values read so far, in reading order.
    pub fn into_effective(self) -> Vec<Effective> {
        self.effective.into_inner()
    }

    /// The layers read.
    pub fn sources(&self) -> &Sources<'a> {
        self.sources
    }

    /// The setting's own text, from the highest layer that sets it.
    fn raw(&self, s: &'static Setting) -> Result<Option<Raw>, ConfigError> {
        let mut from_env = self.sources.env(s.var).map(|text| Raw {
            text,
            origin: Origin::Env(s.var),
            unit: None,
        });
        for alias in s.aliases {
            if let Some(text) = self.sources.env(alias.var) {
                if from_env.is_some() {
                    return Err(ConfigError {
                        var: s.var,
                        problem: format!(
                            "{} is set too, an older name of the same setting: keep one",
                            alias.var
                        ),
                    });
                }
                from_env = Some(Raw {
                    text,
                    origin: Origin::Env(alias.var),
                    unit: alias.unit,
                });
            }
        }
        Ok(from_env.or_else(|| {
            self.sources.file(s.key).map(|text| Raw {
                text,
                origin: Origin::File,
                unit: None,
            })
        }))
    }

    /// Reads `s` with `parse`, its default when unset (`None` if it has none), and records it.
    pub fn parse<T>(
        &self,
        s: &'static Setting,
        parse: impl Fn(&str, Option<Unit>) -> Result<T, String>,
    ) -> Result<Option<T>, ConfigError> {
        let raw = match self.raw(s)? {
            Some(raw) => raw,
            None => match s.default {
                Default::Value(text) => Raw {
                    text: text.to_string(),
                    origin: Origin::Default,
                    unit: None,
                },
                Default::Unset | Default::Computed(_) => {
                    self.record(s, None, Origin::Default);
                    return Ok(None);
                }
            },
        };
        let value = parse(&raw.text, raw.unit).map_err(|problem| self.error(s, &raw, problem))?;
        self.record(s, Some(raw.text), raw.origin);
        Ok(Some(value))
    }

    /// Replaces the recorded value of `s` with how it is shown: a default worked out at
    /// start-up, or a value in its canonical spelling.
    pub fn show(&self, s: &'static Setting, shown: String) {
        if let Some(e) = self
            .effective
            .borrow_mut()
            .iter_mut()
            .rev()
            .find(|e| std::ptr::eq(e.setting, s))
        {
            e.value = Some(shown);
        }
    }

    fn record(&self, setting: &'static Setting, value: Option<String>, origin: Origin) {
        self.effective.borrow_mut().push(Effective {
            setting,
            value,
            origin,
        });
    }

    fn error(&self, s: &'static Setting, raw: &Raw, problem: String) -> ConfigError {
        match &raw.origin {
            Origin::Env(var) => ConfigError { var, problem },
            Origin::File => ConfigError {
                var: s.var,
                problem: format!("{problem} (key {} of {})", s.key, self.sources.file_name()),
            },
            Origin::Default => ConfigError {
                var: s.var,
                problem: format!("the default {:?} does not parse: {problem}", raw.text),
            },
        }
    }

    /// Free text (`None`: unset).
    pub fn text(&self, s: &'static Setting) -> Result<Option<String>, ConfigError> {
        self.parse(s, |t, _| Ok(t.to_string()))
    }

    /// A flag (unset without a default: `false`).
    pub fn flag(&self, s: &'static Setting) -> Result<bool, ConfigError> {
        Ok(self.parse(s, |t, _| parse_flag(t))?.unwrap_or(false))
    }

    /// A number of the setting's type.
    pub fn number<T>(&self, s: &'static Setting) -> Result<T, ConfigError>
    where
        T: std::str::FromStr + std::default::Default,
        T::Err: std::fmt::Display,
    {
        Ok(self
            .parse(s, |t, _| {
                t.parse::<T>()
                    .map_err(|e| format!("{t:?} is not a valid number ({e})"))
            })?
            .unwrap_or_default())
    }

    /// A number above zero.
    pub fn positive<T>(&self, s: &'static Setting) -> Result<T, ConfigError>
    where
        T: std::str::FromStr + std::default::Default + PartialOrd,
        T::Err: std::fmt::Display,
    {
        Ok(self
            .parse(s, |t, _| {
                let n = t
                    .parse::<T>()
                    .map_err(|e| format!("{t:?} is not a valid number ({e})"))?;
                if n <= T::default() {
                    return Err("must be greater than zero".to_string());
                }
                Ok(n)
            })?
            .unwrap_or_default())
    }

    /// A duration (zero allowed).
    pub fn duration(&self, s: &'static Setting) -> Result<Duration, ConfigError> {
        let d = self.parse(s, parse_duration)?.unwrap_or_default();
        self.show(s, format_duration(d));
        Ok(d)
    }

    /// A duration above zero.
    pub fn positive_duration(&self, s: &'static Setting) -> Result<Duration, ConfigError> {
        let d = self
            .parse(s, |t, unit| {
                let d = parse_duration(t, unit)?;
                if d.is_zero() {
                    return Err("must be greater than zero".to_string());
                }
                Ok(d)
            })?
            .unwrap_or_default();
        self.show(s, format_duration(d));
        Ok(d)
    }

    /// Durations above zero, comma-separated, at most `max` of them.
    pub fn durations(&self, s: &'static Setting, max: usize) -> Result<Vec<Duration>, ConfigError> {
        let delays = self
            .parse(s, |t, unit| {
                let delays = t
                    .split(',')
                    .map(|part| match parse_duration(part, unit) {
                        Ok(d) if !d.is_zero() => Ok(d),
                        Ok(_) => Err(format!("{part:?} is not above zero")),
                        Err(e) => Err(e),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if delays.len() > max {
                    return Err(format!("at most {max} delays (each is a queue)"));
                }
                Ok(delays)
            })?
            .unwrap_or_default();
        let shown: Vec<String> = delays.iter().map(|d| format_duration(*d)).collect();
        self.show(s, shown.join(","));
        Ok(delays)
    }
}

/// `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`.
pub fn parse_flag(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "0" | "false" | "no" | "off" => Ok(false),
        "1" | "true" | "yes" | "on" => Ok(true),
        other => Err(format!("{other:?} is not a boolean (use true or false)")),
    }
}

/// A duration: `500ms`, `30s`, `1.5s`, `5m`, `1h`, `7d`; a bare number only where an older
/// variable name gives its unit.
pub fn parse_duration(text: &str, bare: Option<Unit>) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (a number and a unit: 500ms, 30s, 5m)"))?;
    let seconds = match (unit.trim(), bare) {
        ("ms", _) | ("", Some(Unit::Millis)) => number / 1000.0,
        ("s", _) | ("", Some(Unit::Seconds)) => number,
        ("m", _) => number * 60.0,
        ("h", _) => number * 3600.0,
        ("d", _) => number * 86_400.0,
        ("", None) => {
            return Err(format!(
                "{text:?} has no unit: write {text}s, {text}ms or {text}m"
            ));
        }
        (other, _) => return Err(format!("{other:?} is not a unit (ms, s, m, h, d)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// The shortest spelling of a duration in the units [`parse_duration`] reads.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return format!("{}s", d.as_secs_f64());
    }
    match ms {
        0 => "0s".to_string(),
        ms if ms.is_multiple_of(86_400_000) => format!("{}d", ms / 86_400_000),
        ms if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        ms if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        ms if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}
