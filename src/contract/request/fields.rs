//! The parser's ground floor: the report that collects every violation with its JSON path, and
//! field access that accepts camelCase and PascalCase and treats `null` as absent. The envelope
//! ([`super::parse`]) and the items ([`super::items`]) both stand on it.

use serde_json::{Map, Value};

use crate::contract::codes::ErrorCode;
use crate::contract::ids::check_id;
use crate::contract::invoke::ErrorMessage;

/// Errors and warnings collected while walking the body.
#[derive(Default)]
pub(super) struct Report {
    pub(super) errors: Vec<ErrorMessage>,
    pub(super) warnings: Vec<ErrorMessage>,
}

impl Report {
    pub(super) fn error(&mut self, code: ErrorCode, path: &str, msg: impl std::fmt::Display) {
        self.errors
            .push(ErrorMessage::new(code, format!("{path}: {msg}")));
    }
    pub(super) fn warn(&mut self, code: ErrorCode, path: &str, msg: impl std::fmt::Display) {
        self.warnings
            .push(ErrorMessage::new(code, format!("{path}: {msg}")));
    }
}

pub(super) fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

/// camelCase form of a key that may be PascalCase (`SessionId` → `sessionId`).
pub(super) fn camel(key: &str) -> String {
    let mut chars = key.chars();
    match chars.next() {
        Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// A JSON object's fields, matched by camelCase name; nulls count as absent.
pub(super) struct Fields<'a> {
    path: String,
    found: Vec<(&'static str, &'a Value)>,
}

impl<'a> Fields<'a> {
    /// Sorts an object's keys into known fields (kept), server-owned fields (errors) and unknown
    /// fields (warnings).
    pub(super) fn collect(
        map: &'a Map<String, Value>,
        path: &str,
        known: &[&'static str],
        forbidden: &[&'static str],
        report: &mut Report,
    ) -> Self {
        let mut found: Vec<(&'static str, &'a Value)> = Vec::new();
        for (key, value) in map {
            let name = camel(key);
            let exact = key == &name || key.starts_with(|c: char| c.is_ascii_uppercase());
            if let Some(field) = known.iter().find(|k| **k == name).filter(|_| exact) {
                if value.is_null() {
                    continue;
                }
                if found.iter().any(|(f, _)| f == field) {
                    report.error(
                        ErrorCode::DuplicateField,
                        &join(path, field),
                        "is given twice (camelCase and PascalCase)",
                    );
                    continue;
                }
                found.push((field, value));
            } else if forbidden.contains(&name.as_str()) {
                if !value.is_null() {
                    report.error(
                        ErrorCode::ForbiddenField,
                        &join(path, &name),
                        "is server-owned state and must not be sent by clients",
                    );
                }
            } else {
                report.warn(
                    ErrorCode::UnknownField,
                    &join(path, key),
                    "is not part of the contract and was ignored",
                );
            }
        }
        Self {
            path: path.to_string(),
            found,
        }
    }

    pub(super) fn get(&self, name: &str) -> Option<&'a Value> {
        self.found.iter().find(|(f, _)| *f == name).map(|(_, v)| *v)
    }

    pub(super) fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub(super) fn path(&self, name: &str) -> String {
        join(&self.path, name)
    }

    pub(super) fn string(&self, name: &str, report: &mut Report) -> Option<&'a str> {
        let v = self.get(name)?;
        match v.as_str() {
            Some(s) => Some(s),
            None => {
                report.error(
                    ErrorCode::InvalidFieldType,
                    &self.path(name),
                    format!("must be a string, not {}", kind_of(v)),
                );
                None
            }
        }
    }

    pub(super) fn required_string(&self, name: &str, report: &mut Report) -> Option<&'a str> {
        if !self.has(name) {
            report.error(ErrorCode::MissingField, &self.path(name), "is required");
            return None;
        }
        self.string(name, report)
    }

    pub(super) fn array(&self, name: &str, report: &mut Report) -> Option<&'a Vec<Value>> {
        let v = self.get(name)?;
        match v.as_array() {
            Some(a) => Some(a),
            None => {
                report.error(
                    ErrorCode::InvalidFieldType,
                    &self.path(name),
                    format!("must be an array, not {}", kind_of(v)),
                );
                None
            }
        }
    }

    pub(super) fn object(&self, name: &str, report: &mut Report) -> Option<&'a Map<String, Value>> {
        let v = self.get(name)?;
        match v.as_object() {
            Some(o) => Some(o),
            None => {
                report.error(
                    ErrorCode::InvalidFieldType,
                    &self.path(name),
                    format!("must be an object, not {}", kind_of(v)),
                );
                None
            }
        }
    }

    pub(super) fn bool(&self, name: &str, report: &mut Report) -> Option<bool> {
        let v = self.get(name)?;
        match v.as_bool() {
            Some(b) => Some(b),
            None => {
                report.error(
                    ErrorCode::InvalidFieldType,
                    &self.path(name),
                    format!("must be a boolean, not {}", kind_of(v)),
                );
                None
            }
        }
    }

    /// `onBusy`: absent means `enqueue`.
    pub(super) fn on_busy(&self, report: &mut Report) -> super::OnBusy {
        let Some(value) = self.string("onBusy", report) else {
            return super::OnBusy::default();
        };
        super::OnBusy::parse(value).unwrap_or_else(|| {
            report.error(
                ErrorCode::InvalidOnBusy,
                &self.path("onBusy"),
                format!(
                    "must be one of {} (got {value:?})",
                    super::OnBusy::VALUES.join(", ")
                ),
            );
            super::OnBusy::default()
        })
    }

    /// A required id with the safe-charset rule.
    pub(super) fn id<T>(
        &self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<T, crate::contract::ids::IdError>,
        report: &mut Report,
    ) -> Option<T> {
        let s = self.required_string(name, report)?;
        match parse(s) {
            Ok(id) => Some(id),
            Err(e) => {
                report.error(ErrorCode::InvalidId, &self.path(name), e);
                None
            }
        }
    }

    /// An optional context id (names a configured context): same charset rule as ids.
    pub(super) fn context_id(&self, name: &str, report: &mut Report) -> Option<String> {
        let s = self.string(name, report)?;
        match check_id(s) {
            Ok(()) => Some(s.to_string()),
            Err(e) => {
                report.error(ErrorCode::InvalidId, &self.path(name), e);
                None
            }
        }
    }
}

pub(super) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Parses every element of an array of objects; `None` if any element was invalid.
pub(super) fn parse_list<T>(
    items: &[Value],
    name: &str,
    report: &mut Report,
    mut parse: impl FnMut(&Map<String, Value>, &str, &mut Report) -> Option<T>,
) -> Option<Vec<T>> {
    let mut out = Vec::with_capacity(items.len());
    let mut all_ok = true;
    for (i, item) in items.iter().enumerate() {
        let path = format!("{name}[{i}]");
        match item.as_object() {
            Some(m) => match parse(m, &path, report) {
                Some(t) => out.push(t),
                None => all_ok = false,
            },
            None => {
                report.error(
                    ErrorCode::InvalidFieldType,
                    &path,
                    format!("must be an object, not {}", kind_of(item)),
                );
                all_ok = false;
            }
        }
    }
    all_ok.then_some(out)
}
