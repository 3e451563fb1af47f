//! A JSON object's top-level members, found without parsing their values: each member's
//! name and the text of its value, for the caller to parse the few it reads. A model's
//! answer echoes the request's tools and instructions (kilobytes of schema text no client
//! reads); a skim passes over a string with one `memchr` and over a container by its
//! brackets, where serde_json's `IgnoredAny` walks every token.
//!
//! A skim checks a value it passes over only for what finds its end: strings closed,
//! brackets matched (not its numbers, literals, commas or control characters). What it
//! cannot walk — text that is no object, a name with an escape, a member past its depth
//! limit — the caller reads the full way, so its errors are the parser's own.
//!
//! Owns: walking an object's top level. Must not: parse values, or decide what a member
//! means.

use std::ops::ControlFlow;

/// How deep a skimmed value may nest: the brackets still open are a bit each in a `u64`.
const MAX_DEPTH: u32 = 64;

/// Calls `each` with every top-level member of the object `text` holds, in order: its name
/// (as written between the quotes) and its value's text. `None` when `text` is not an object
/// a skim can walk, or `each` broke off: the caller then reads `text` the full way.
pub(super) fn members<'a>(
    text: &'a [u8],
    mut each: impl FnMut(&'a [u8], &'a [u8]) -> ControlFlow<()>,
) -> Option<()> {
    let mut at = blank(text, 0);
    if text.get(at) != Some(&b'{') {
        return None;
    }
    at = blank(text, at + 1);
    if text.get(at) == Some(&b'}') {
        return (blank(text, at + 1) == text.len()).then_some(());
    }
    loop {
        if text.get(at) != Some(&b'"') {
            return None;
        }
        let name_end = string_end(text, at)?;
        let name = &text[at + 1..name_end - 1];
        if name.contains(&b'\\') {
            return None;
        }
        at = blank(text, name_end);
        if text.get(at) != Some(&b':') {
            return None;
        }
        let start = blank(text, at + 1);
        let end = value_end(text, start)?;
        if each(name, &text[start..end]).is_break() {
            return None;
        }
        at = blank(text, end);
        match text.get(at) {
            Some(b',') => at = blank(text, at + 1),
            Some(b'}') => return (blank(text, at + 1) == text.len()).then_some(()),
            _ => return None,
        }
    }
}

/// The first index at or after `at` that is not JSON whitespace.
fn blank(text: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = text.get(at) {
        at += 1;
    }
    at
}

/// The index just past the string opening at `at` (its closing quote's successor).
fn string_end(text: &[u8], at: usize) -> Option<usize> {
    let mut i = at + 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', text.get(i..)?)?;
        if text[i] == b'\\' {
            // The escaped character is passed over whatever it is (a quote included).
            i += 2;
        } else {
            return Some(i + 1);
        }
    }
}

/// The index just past the value starting at `at`.
fn value_end(text: &[u8], at: usize) -> Option<usize> {
    match *text.get(at)? {
        b'"' => string_end(text, at),
        b'{' | b'[' => container_end(text, at),
        _ => {
            // A number or a literal: up to the next delimiter; never empty.
            let len = text[at..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(text.len() - at);
            let scalar = &text[at..at + len];
            let starts_well = matches!(
                scalar.first(),
                Some(b'-' | b'0'..=b'9' | b't' | b'f' | b'n')
            );
            starts_well.then_some(at + len)
        }
    }
}

/// The index just past the object or array opening at `at`, its brackets matched (an
/// object's closed by `}`, an array's by `]`).
fn container_end(text: &[u8], at: usize) -> Option<usize> {
    // Bit `d` of `open` is set when the bracket open at depth `d` is an object's.
    let mut open: u64 = 0;
    let mut depth: u32 = 0;
    let mut i = at;
    loop {
        match *text.get(i)? {
            b'"' => {
                i = string_end(text, i)?;
                continue;
            }
            c @ (b'{' | b'[') => {
                if depth == MAX_DEPTH {
                    return None;
                }
                if c == b'{' {
                    open |= 1 << depth;
                } else {
                    open &= !(1 << depth);
                }
                depth += 1;
            }
            c @ (b'}' | b']') => {
                depth = depth.checked_sub(1)?;
                let was_object = open & (1 << depth) != 0;
                if was_object != (c == b'}') {
                    return None;
                }
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;

    use proptest::prelude::*;
    use serde_json::Value;

    use super::members;

    /// The members a skim finds, as owned text.
    fn skim(text: &str) -> Option<Vec<(String, String)>> {
        let mut found = Vec::new();
        members(text.as_bytes(), |name, value| {
            found.push((
                String::from_utf8_lossy(name).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            ));
            ControlFlow::Continue(())
        })
        .map(|()| found)
    }

    /// The members serde_json finds (names unescaped; the map keeps their order).
    fn parsed(text: &str) -> Vec<(String, String)> {
        let map: serde_json::Map<String, Value> = serde_json::from_str(text).expect("an object");
        map.into_iter().map(|(k, v)| (k, v.to_string())).collect()
    }

    /// Each skimmed value is the text of the member's value: parsed, it is serde_json's.
    fn agree(text: &str) {
        let skimmed = skim(text).unwrap_or_else(|| panic!("a skim walks {text}"));
        let as_parsed: Vec<(String, String)> = skimmed
            .into_iter()
            .map(|(k, v)| {
                let value: Value = serde_json::from_str(&v)
                    .unwrap_or_else(|e| panic!("{k}'s value {v:?} is not whole JSON ({e})"));
                (k, value.to_string())
            })
            .collect();
        assert_eq!(as_parsed, parsed(text), "{text}");
    }

    #[test]
    fn finds_each_member_and_its_values_text() {
        let text = r#" { "id" : "r\"1\\" , "tools":[{"type":"function","parameters":{"a":[1,{"b":"}]"}]}}],
            "n": -1.5e3, "t":true, "z":null, "s":"[{", "e":{} , "a":[] }
        "#;
        agree(text);
        let found = skim(text).expect("walks");
        assert_eq!(found[0], ("id".into(), r#""r\"1\\""#.into()));
        assert_eq!(found[2], ("n".into(), "-1.5e3".into()));
        assert_eq!(found.len(), 8);
        // Long strings, with an escaped quote and an escaped backslash last.
        let long = r#"{"x":"0123456789abcdef0123456789\"abcdef","y":"0123456789abcdef01\\","z":1}"#;
        agree(long);
        assert_eq!(
            skim(long).map(|m| m[2].clone()),
            Some(("z".into(), "1".into()))
        );
        assert_eq!(skim("{}"), Some(Vec::new()));
        assert_eq!(skim(" {\n} \n"), Some(Vec::new()));
    }

    #[test]
    fn the_openai_examples_skim_as_they_parse() {
        for example in [
            include_str!(
                "../../tests/fixtures/openai/examples/01_text_response_openai_python_live_snapshot.json"
            ),
            include_str!(
                "../../tests/fixtures/openai/examples/01b_text_response_spec_example.json"
            ),
            include_str!("../../tests/fixtures/openai/examples/02_function_call_response.json"),
        ] {
            agree(example);
        }
    }

    /// What a skim cannot walk it leaves to the parser: no object, unclosed or mismatched
    /// brackets, an unclosed string, a missing colon or comma, trailing text, an escaped name.
    #[test]
    fn gives_up_where_the_text_is_not_an_object_it_can_walk() {
        for text in [
            "",
            "[1]",
            "\"s\"",
            "{",
            r#"{"a":1"#,
            r#"{"a":[1}"#,
            r#"{"a":{"b":1]}"#,
            r#"{"a":[1]]}"#,
            r#"{"a":"open}"#,
            r#"{"a" 1}"#,
            r#"{"a":1 "b":2}"#,
            r#"{"a":1,}"#,
            r#"{"a":}"#,
            r#"{"a":1} x"#,
            r#"{"a":1}{}"#,
            r#"{"\u0069d":"r"}"#,
            r#"{a:1}"#,
            r#"{"a":+1}"#,
        ] {
            assert_eq!(skim(text), None, "{text:?}");
        }
        let deep = format!(r#"{{"a":{}{}}}"#, "[".repeat(65), "]".repeat(65));
        assert_eq!(skim(&deep), None);
        let deep_enough = format!(r#"{{"a":{}{}}}"#, "[".repeat(64), "]".repeat(64));
        assert_eq!(skim(&deep_enough).map(|m| m.len()), Some(1));
    }

    #[test]
    fn a_caller_that_breaks_off_gets_none() {
        let mut seen = 0;
        let walked = members(br#"{"a":1,"b":2,"c":3}"#, |_, _| {
            seen += 1;
            if seen == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        assert_eq!((walked, seen), (None, 2));
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            ".{0,12}".prop_map(Value::String),
            r#"[\\"{}\[\]:, a\n]{0,8}"#.prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((r#"[a-z"\\{}\[\]]{0,6}"#, inner), 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Any object, compact or pretty, skims to serde_json's members.
        #[test]
        fn any_object_skims_as_it_parses(
            members in prop::collection::vec((r#"[a-z_ "{}\[\]:,]{0,8}"#, json()), 0..8),
            pretty in any::<bool>(),
        ) {
            let object = Value::Object(members.into_iter().collect());
            let text = if pretty {
                serde_json::to_string_pretty(&object).expect("serialises")
            } else {
                object.to_string()
            };
            // A name serialised with an escape (a quote, a backslash) is left to the parser.
            let escaped_name = object
                .as_object()
                .is_some_and(|m| m.keys().any(|k| k.contains(['"', '\\'])));
            if escaped_name {
                prop_assert_eq!(skim(&text), None);
                return Ok(());
            }
            agree(&text);
        }
    }
}
