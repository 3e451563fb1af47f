//! Skimming a model's answer: the members of a `Response` object the client reads, picked out
//! of the answer's text without parsing the others.
//!
//! A Responses API answer echoes the request (its instructions, its tools with their JSON
//! schemas, its metadata…): most of its bytes are members this client never reads. Parsing
//! skips them too, but one byte at a time; here each member's extent is found by jumping from
//! one quote or backslash to the next (`memchr`) and counting brackets, and only the members
//! asked for are copied into a small object that is then parsed as before.
//!
//! What a member that is not read must be is checked only as far as finding its end needs:
//! its strings closed and their escapes JSON's, its brackets balanced and matched, no deeper
//! than the parser goes. (Its numbers and literals are not read, nor are its strings checked
//! for raw control characters: a member the client does not read cannot change the answer.) Anything the skim cannot follow — an escaped member name, a bracket out of place,
//! an answer cut short — gives `None`, and the caller parses the whole answer, which says
//! precisely what is wrong with it.

use memchr::memchr2;

/// How deep the skim follows brackets inside a member: serde_json's recursion limit (128),
/// less the answer's own object.
const MAX_DEPTH: u32 = 127;

/// A JSON object of the members of the object `bytes` whose names are in `wanted`, in their
/// order in `bytes` (a name given twice is copied twice, so the parse refuses it as it would
/// the whole answer); `None` when `bytes` cannot be skimmed.
pub(super) fn pick(bytes: &[u8], wanted: &[&str]) -> Option<Vec<u8>> {
    let mut picked = Vec::with_capacity(bytes.len().min(4096));
    picked.push(b'{');
    let mut i = whitespace(bytes, 0);
    if bytes.get(i) != Some(&b'{') {
        return None;
    }
    i = whitespace(bytes, i + 1);
    if bytes.get(i) == Some(&b'}') {
        return end_of_text(bytes, i + 1).then(|| vec![b'{', b'}']);
    }
    loop {
        if bytes.get(i) != Some(&b'"') {
            return None;
        }
        let name_end = string_end(bytes, i + 1)?;
        let name = bytes.get(i + 1..name_end - 1)?;
        if name.contains(&b'\\') {
            return None;
        }
        i = whitespace(bytes, name_end);
        if bytes.get(i) != Some(&b':') {
            return None;
        }
        let start = whitespace(bytes, i + 1);
        let end = value_end(bytes, start)?;
        if wanted.iter().any(|w| w.as_bytes() == name) {
            if picked.len() > 1 {
                picked.push(b',');
            }
            picked.push(b'"');
            picked.extend_from_slice(name);
            picked.extend_from_slice(b"\":");
            picked.extend_from_slice(bytes.get(start..end)?);
        }
        i = whitespace(bytes, end);
        match bytes.get(i) {
            Some(b',') => i = whitespace(bytes, i + 1),
            Some(b'}') => {
                picked.push(b'}');
                return end_of_text(bytes, i + 1).then_some(picked);
            }
            _ => return None,
        }
    }
}

/// Only whitespace from `i` to the end.
fn end_of_text(bytes: &[u8], i: usize) -> bool {
    whitespace(bytes, i) == bytes.len()
}

/// The first index at or after `i` that is not JSON whitespace.
fn whitespace(bytes: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = bytes.get(i) {
        i += 1;
    }
    i
}

/// Just past the closing quote of the string whose text starts at `i`.
fn string_end(bytes: &[u8], mut i: usize) -> Option<usize> {
    loop {
        let at = i + memchr2(b'"', b'\\', bytes.get(i..)?)?;
        if bytes[at] == b'"' {
            return Some(at + 1);
        }
        // A backslash and what it escapes: one of JSON's escapes, as the parser checks them.
        i = match bytes.get(at + 1)? {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => at + 2,
            b'u' if bytes.get(at + 2..at + 6)?.iter().all(u8::is_ascii_hexdigit) => at + 6,
            _ => return None,
        };
    }
}

/// Just past the value that starts at `start`.
fn value_end(bytes: &[u8], start: usize) -> Option<usize> {
    // One bit per open bracket, the innermost lowest: 1 for an object, 0 for an array.
    let mut open: u128 = 0;
    let mut depth = 0;
    let mut i = start;
    loop {
        let c = *bytes.get(i)?;
        match c {
            b'"' => i = string_end(bytes, i + 1)?,
            b'{' | b'[' => {
                if depth == MAX_DEPTH {
                    return None;
                }
                open = open << 1 | u128::from(c == b'{');
                depth += 1;
                i += 1;
                continue;
            }
            b'}' | b']' => {
                if depth == 0 || (open & 1 == 1) != (c == b'}') {
                    return None;
                }
                open >>= 1;
                depth -= 1;
                i += 1;
            }
            _ if depth == 0 => {
                // A number, `true`, `false` or `null`: up to the first byte none can hold.
                let len = bytes[i..]
                    .iter()
                    .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                    .unwrap_or(bytes.len() - i);
                return Some(i + len);
            }
            _ => {
                i += 1;
                continue;
            }
        }
        if depth == 0 {
            return Some(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse::{Wire, parse_bytes, parse_whole};
    use super::*;

    fn example(name: &str) -> serde_json::Value {
        let path = format!(
            "{}/tests/fixtures/openai/examples/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(&path).expect("example")).expect("json")
    }

    /// Skimmed or parsed whole, an answer reads the same — the answer, or the error and its
    /// message — whatever members, escapes, order and spacing it has; so a field `Wire` reads
    /// and `Wire::MEMBERS` leaves out fails here for the examples that carry it.
    #[test]
    fn a_skimmed_answer_reads_as_the_whole_answer() {
        let failed = example("04_response_failed_event.json")["response"].clone();
        let mut answers: Vec<Vec<u8>> = [
            "01_text_response_openai_python_live_snapshot.json",
            "01b_text_response_spec_example.json",
            "02_function_call_response.json",
        ]
        .into_iter()
        .map(|name| serde_json::to_vec_pretty(&example(name)).unwrap())
        .collect();
        answers.push(serde_json::to_vec(&failed).unwrap());
        answers.extend(
            [
                // Every member read, escapes in them and in the members skipped.
                r#"{"instructions":"be \"brief\"\n\\ {[","id":"resp_\u0031","status":"incomplete",
                  "incomplete_details":{"reason":"max_output_tokens"},"error":null,
                  "tools":[{"type":"function","name":"f","parameters":{"type":"object",
                    "properties":{"q":{"type":"string","description":"a \"}\" here"}}}}],
                  "output":[{"type":"message","content":[{"type":"output_text","text":"caf\u00e9 \"ok\""}]},
                    {"type":"function_call","call_id":"c1","name":"f","arguments":"{\"q\":\"x\"}"}],
                  "usage":{"input_tokens":5,"output_tokens":2,"total_tokens":7,
                    "input_tokens_details":{"cached_tokens":1},"output_tokens_details":{"reasoning_tokens":0}},
                  "service_tier":"flex","metadata":{},"temperature":1.0,"top_p":null,"store":true}"#,
                // Refusals and failures.
                r#"{"id":"r","status":"failed","error":{"code":"rate_limit_exceeded","message":"slow"},"output":[]}"#,
                r#"{"id":"r","status":"cancelled","output":[]}"#,
                r#"{"id":"r","output":[{"type":"message","content":[{"type":"refusal","refusal":"no"}]}]}"#,
                // Not answers: the same error either way.
                r#"{"status":"completed","output":[]}"#,
                r#"{"id":"r","status":"completed"}"#,
                r#"{"id":"r","id":"s","output":[]}"#,
                r#"{"id":7,"output":[]}"#,
                r#"{"id":"r","output":[],"usage":{"input_tokens":"many"}}"#,
                r#"{"id":"r","output":[],"tools":[1,2}"#,
                r#"{"id":"r","output":[]} {"#,
                "[]",
                "not json",
            ]
            .map(|a| a.as_bytes().to_vec()),
        );
        for answer in &answers {
            let shown = String::from_utf8_lossy(answer);
            assert_eq!(
                format!("{:?}", parse_bytes(answer)),
                format!("{:?}", parse_whole(answer)),
                "{shown}"
            );
        }
        // Cut short anywhere, or with any one byte made a quote, a backslash or a bracket:
        // never a panic; the whole parse's verdict, but for an answer broken only inside a
        // member the client does not read, which the skim does not parse.
        let full = &answers[4];
        let (mut same, mut lenient) = (0, 0);
        for cut in 0..full.len() {
            let prefix = &full[..cut];
            assert_eq!(
                format!("{:?}", parse_bytes(prefix)),
                format!("{:?}", parse_whole(prefix))
            );
            for b in [b'"', b'\\', b'{', b']'] {
                let mut changed = full.clone();
                changed[cut] = b;
                let shown = String::from_utf8_lossy(&changed);
                match (parse_bytes(&changed), parse_whole(&changed)) {
                    (skimmed, whole) if format!("{skimmed:?}") == format!("{whole:?}") => same += 1,
                    (Ok(_), Err(e)) => {
                        assert!(
                            format!("{e:?}").contains("the answer is not JSON ("),
                            "only a syntax error is not seen: {e:?} in {shown}"
                        );
                        let reread = serde_json::from_slice::<serde_json::Value>(
                            &pick(&changed, Wire::MEMBERS).expect("skimmed"),
                        );
                        assert!(reread.is_ok(), "the members read are whole JSON: {shown}");
                        lenient += 1;
                    }
                    (skimmed, whole) => panic!("{skimmed:?} vs {whole:?} for {shown}"),
                }
            }
        }
        assert!(
            same > 10 * lenient,
            "{same} read alike, {lenient} only by the skim"
        );
        // The examples are skimmed (not all left to the whole parse), and they do parse.
        for answer in &answers[..4] {
            assert!(pick(answer, &["id"]).is_some());
        }
        assert!(answers[..3].iter().all(|a| parse_bytes(a).is_ok()));
    }

    fn picked(json: &str, wanted: &[&str]) -> Option<String> {
        pick(json.as_bytes(), wanted).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn picks_the_wanted_members_in_their_order() {
        let json = r#" { "id" : "r_1", "tools": [{"a": {"b": [1, 2, {"c": "}]\"{["}]}}],
            "instructions": "line\n\"quoted\" \\ end", "n": -1.5e3, "t": true, "z": null,
            "output": [ {"type": "message"} ], "usage": {"input_tokens": 3} } "#;
        assert_eq!(
            picked(json, &["usage", "id", "output", "n", "z"]).unwrap(),
            r#"{"id":"r_1","n":-1.5e3,"z":null,"output":[ {"type": "message"} ],"usage":{"input_tokens": 3}}"#
        );
        assert_eq!(picked("{}", &["id"]).unwrap(), "{}");
        assert_eq!(picked(r#"{"a":1}"#, &["id"]).unwrap(), "{}");
        assert_eq!(
            picked(r#"{"id":1,"id":2}"#, &["id"]).unwrap(),
            r#"{"id":1,"id":2}"#
        );
    }

    #[test]
    fn what_it_cannot_follow_is_left_to_the_parser() {
        for broken in [
            "",
            "[]",
            r#""id""#,
            r#"{"id": "r_1""#,
            r#"{"id": "r_1",}"#,
            r#"{"id" "r_1"}"#,
            r#"{"a": [1, 2}"#,
            r#"{"a": {"b": 1]}"#,
            r#"{"a": "unclosed}"#,
            r#"{"a": "ends in a backslash\"#,
            r#"{"a": 1]"#,
            r#"{"a": 1} trailing"#,
            r#"{"a": 1}}"#,
            r#"{"\u0069d": "r_1"}"#,
            r#"{id: 1}"#,
        ] {
            assert_eq!(pick(broken.as_bytes(), &["id"]), None, "{broken:?}");
        }
        let deep = format!("{{\"a\": {}{}}}", "[".repeat(128), "]".repeat(128));
        assert_eq!(
            pick(deep.as_bytes(), &["id"]),
            None,
            "deeper than the parser goes"
        );
        let deepest = format!("{{\"a\": {}{}}}", "[".repeat(127), "]".repeat(127));
        assert_eq!(
            picked(&deepest, &["a"]).unwrap(),
            deepest.replace(": ", ":")
        );
    }
}
