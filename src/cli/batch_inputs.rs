//! The inputs of `aptix batch` and their ids: a folder's `*.md` files or an NDJSON file's lines
//! read into requests, and the stable session and turn ids each gets in one output folder.
//!
//! Owns: reading inputs, the output folder's salt, the ids. Must not: talk to the API.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use aptix_worker::contract::request::default_id;
use aptix_worker::contract::text_without_bom;

/// One input of a batch: its customId and the request (ids filled in by [`assign_ids`]).
pub(super) struct Item {
    pub(super) custom_id: String,
    pub(super) request: Value,
}

/// Reads the inputs of a batch: the `*.md` files of a folder (each with `instruction`), or the
/// lines of an NDJSON file (`instruction` fills in requests without one).
pub(super) fn read_inputs(input: &Path, instruction: Option<&str>) -> anyhow::Result<Vec<Item>> {
    if input.is_dir() {
        let Some(instruction) = instruction else {
            bail!("--instruction is required when the input is a folder");
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(input)
            .with_context(|| format!("reading {}", input.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "md"))
            .collect();
        files.sort();
        let mut items = Vec::with_capacity(files.len());
        for path in files {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let contents = read_text(&path)?;
            items.push(Item {
                custom_id: name.clone(),
                request: json!({
                    "instruction": instruction,
                    "inputArtifacts": [{
                        "relativePath": name,
                        "fileName": name,
                        "contents": contents,
                        "origin": "user",
                        "language": "markdown"
                    }]
                }),
            });
        }
        if items.is_empty() {
            bail!("no *.md files in {}", input.display());
        }
        return Ok(items);
    }
    let text = read_text(input)?;
    let mut items = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not JSON", input.display(), n + 1))?;
        let Some(custom_id) = v["customId"].as_str() else {
            bail!(
                "{} line {}: a string customId is required",
                input.display(),
                n + 1
            );
        };
        let mut request = v["request"].clone();
        if let (Some(instruction), Some(obj)) = (instruction, request.as_object_mut()) {
            obj.entry("instruction")
                .or_insert_with(|| Value::String(instruction.to_string()));
        }
        items.push(Item {
            custom_id: custom_id.to_string(),
            request,
        });
    }
    Ok(items)
}

/// An input file's text, without the byte order mark it may begin with.
fn read_text(path: &Path) -> anyhow::Result<String> {
    let mut text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {} (inputs must be UTF-8)", path.display()))?;
    let mark = text.len() - text_without_bom(&text).len();
    text.drain(..mark);
    Ok(text)
}

/// Per output folder state: a random salt that makes this folder's turn ids its own, so a
/// re-run after a crash finds the turns it submitted instead of running them again.
pub(super) fn salt(out: &Path) -> anyhow::Result<String> {
    let file = out.join(".aptix-batch-state.json");
    if let Ok(text) = std::fs::read_to_string(&file)
        && let Ok(v) = serde_json::from_str::<Value>(&text)
        && let Some(s) = v["salt"].as_str()
    {
        return Ok(s.to_string());
    }
    let s = uuid::Uuid::new_v4().simple().to_string();
    std::fs::write(&file, json!({"salt": s}).to_string())
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(s)
}

fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    aptix_worker::hex::lower(&h.finalize()[..12])
}

/// Gives a request stable ids: the same input in the same output folder maps to the same
/// session and turn, and a new attempt after a failure to a new turn.
pub(super) fn assign_ids(item: &mut Item, salt: &str, attempt: u64) {
    let body = item.request.to_string();
    let sid = format!("batch-{}", short_hash(&[salt, &item.custom_id]));
    let tid = format!("t{attempt}-{}", short_hash(&[salt, &item.custom_id, &body]));
    // Ids the input already has (in either spelling) are kept.
    if let Some(obj) = item.request.as_object_mut() {
        default_id(obj, "sessionId", "SessionId", || sid);
        default_id(obj, "turnId", "TurnId", || tid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_saved_behind_a_byte_order_mark_are_read_without_it() {
        let root =
            std::env::temp_dir().join(format!("aptix-bom-{}", uuid::Uuid::new_v4().simple()));
        let folder = root.join("docs");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("a.md"), "\u{feff}# DDR-1 Alpha\n").unwrap();
        let lines = root.join("batch.ndjson");
        std::fs::write(
            &lines,
            "\u{feff}{\"customId\":\"x\",\"request\":{\"instruction\":\"hi\"}}\n",
        )
        .unwrap();
        let from_folder = read_inputs(&folder, Some("Review")).unwrap();
        assert_eq!(
            from_folder[0].request["inputArtifacts"][0]["contents"],
            "# DDR-1 Alpha\n"
        );
        let from_lines = read_inputs(&lines, Some("Review")).unwrap();
        assert_eq!(from_lines[0].custom_id, "x");
        assert_eq!(from_lines[0].request["instruction"], "hi");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn ids_are_stable_per_salt_and_change_per_attempt() {
        let item = || Item {
            custom_id: "a.md".into(),
            request: json!({"instruction": "x"}),
        };
        let (mut a, mut b, mut c, mut d) = (item(), item(), item(), item());
        assign_ids(&mut a, "s1", 0);
        assign_ids(&mut b, "s1", 0);
        assign_ids(&mut c, "s1", 1);
        assign_ids(&mut d, "s2", 0);
        assert_eq!(a.request, b.request);
        assert_eq!(a.request["sessionId"], c.request["sessionId"]);
        assert_ne!(a.request["turnId"], c.request["turnId"]);
        assert_ne!(a.request["sessionId"], d.request["sessionId"]);
        // Ids given in the input are kept, whichever spelling they use.
        let mut given = Item {
            custom_id: "b.md".into(),
            request: json!({"SessionId": "mine", "instruction": "x"}),
        };
        assign_ids(&mut given, "s1", 0);
        assert_eq!(given.request["SessionId"], "mine");
        assert!(given.request.get("sessionId").is_none());
        assert!(given.request["turnId"].as_str().unwrap().starts_with("t0-"));
    }
}
