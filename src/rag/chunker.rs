//! Splitting files into chunks: Markdown by heading, everything else by a bounded number of
//! lines. Line spans are exact (1-based, inclusive) and ids are stable: the same content at the
//! same place of the same file always gets the same id.

use sha2::{Digest as _, Sha256};

use super::Chunk;

/// How files are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkOptions {
    /// The most lines in one chunk (longer Markdown sections are split too).
    pub max_lines: usize,
}

impl Default for ChunkOptions {
    fn default() -> Self {
        Self { max_lines: 60 }
    }
}

/// The language of a file by its extension, if it is a text file worth indexing.
pub fn language_for(path: &str) -> Option<&'static str> {
    let ext = path.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "md" | "markdown" => "markdown",
        "rs" => "rust",
        "cs" => "csharp",
        "ts" | "tsx" => "typescript",
        "js" | "jsx" | "mjs" => "javascript",
        "py" => "python",
        "go" => "go",
        "java" => "java",
        "kt" => "kotlin",
        "json" => "json",
        "yaml" | "yml" => "yaml",
        "toml" => "toml",
        "xml" | "csproj" => "xml",
        "html" => "html",
        "css" => "css",
        "scss" => "scss",
        "sh" => "bash",
        "sql" => "sql",
        "txt" => "text",
        _ => return None,
    })
}

/// A document id such as `AGN-033` or `DDR-101`: 2-6 capitals, a dash, 2-5 digits.
pub fn find_doc_id(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_uppercase() {
            i += 1;
        }
        let letters = i - start;
        let boundary_before = start == 0 || !bytes[start - 1].is_ascii_alphanumeric();
        if (2..=6).contains(&letters) && boundary_before && bytes.get(i) == Some(&b'-') {
            let digits_start = i + 1;
            let mut j = digits_start;
            while j < bytes.len() && bytes[j].is_ascii_digit() {
                j += 1;
            }
            let digits = j - digits_start;
            let boundary_after = j == bytes.len() || !bytes[j].is_ascii_alphanumeric();
            if (2..=5).contains(&digits) && boundary_after {
                return Some(text[start..j].to_string());
            }
        }
        i = if i == start { i + 1 } else { i };
    }
    None
}

/// Tags declared in a document's first lines (`Tags: a, b` or `**Tags:** a, b`).
pub fn find_tags(text: &str) -> Vec<String> {
    for line in text.lines().take(30) {
        let plain = line.replace("**", "");
        let plain = plain.trim();
        let Some(rest) = plain
            .strip_prefix("Tags:")
            .or_else(|| plain.strip_prefix("tags:"))
        else {
            continue;
        };
        return rest
            .split(',')
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .collect();
    }
    Vec::new()
}

/// A stable chunk id from where the chunk is and what it holds.
pub fn chunk_id(repo: &str, path: &str, start: usize, end: usize, content: &str) -> String {
    let mut h = Sha256::new();
    for part in [repo, path, &start.to_string(), &end.to_string(), content] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    format!("c_{}", crate::hex::lower(&h.finalize()[..10]))
}

/// Cuts one file into chunks; `None` when its extension is not indexed.
pub fn chunk_file(
    repo: &str,
    path: &str,
    text: &str,
    extra_tags: &[String],
    opts: ChunkOptions,
) -> Option<Vec<Chunk>> {
    let language = language_for(path)?;
    // A file saved with a byte order mark would otherwise hide its first heading.
    let text = crate::contract::text_without_bom(text);
    let lines: Vec<&str> = text.lines().collect();
    let max = opts.max_lines.max(1);
    let spans = if language == "markdown" {
        markdown_sections(&lines)
            .into_iter()
            .flat_map(|(s, e)| bounded(s, e, max))
            .collect()
    } else {
        bounded(0, lines.len(), max)
    };
    let file_name = path.rsplit('/').next().unwrap_or(path);
    let first_heading = lines.iter().find(|l| l.starts_with('#')).copied();
    let doc_id = find_doc_id(file_name).or_else(|| first_heading.and_then(find_doc_id));
    let mut tags = find_tags(text);
    for t in extra_tags {
        if !tags.contains(t) {
            tags.push(t.clone());
        }
    }
    let chunks = spans
        .into_iter()
        // A span ends at its last non-blank line, so `Lines` is exactly what is shown.
        .map(|(s, mut e)| {
            while e > s && lines[e - 1].trim().is_empty() {
                e -= 1;
            }
            (s, e)
        })
        .filter(|&(s, e)| e > s)
        .map(|(s, e)| {
            let content = lines[s..e].join("\n");
            Chunk {
                id: chunk_id(repo, path, s + 1, e, &content),
                path: path.to_string(),
                line_start: s + 1,
                line_end: e,
                language: language.to_string(),
                repo: repo.to_string(),
                tags: tags.clone(),
                doc_id: doc_id.clone(),
                content,
            }
        })
        .collect();
    Some(chunks)
}

/// `[start, end)` spans of at most `max` lines covering `[start, end)`.
fn bounded(start: usize, end: usize, max: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut s = start;
    while s < end {
        let e = (s + max).min(end);
        out.push((s, e));
        s = e;
    }
    out
}

/// `[start, end)` spans of Markdown sections: each ATX heading (outside fenced code) starts one;
/// text before the first heading is a section of its own.
fn markdown_sections(lines: &[&str]) -> Vec<(usize, usize)> {
    let mut starts = vec![0];
    let mut fence: Option<&str> = None;
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if let Some(f) = fence {
            if t.starts_with(f) {
                fence = None;
            }
            continue;
        }
        if t.starts_with("```") {
            fence = Some("```");
        } else if t.starts_with("~~~") {
            fence = Some("~~~");
        } else if is_heading(line) && i > 0 {
            starts.push(i);
        }
    }
    let mut spans = Vec::with_capacity(starts.len());
    for (k, &s) in starts.iter().enumerate() {
        let e = starts.get(k + 1).copied().unwrap_or(lines.len());
        if e > s {
            spans.push((s, e));
        }
    }
    spans
}

fn is_heading(line: &str) -> bool {
    let hashes = line.bytes().take_while(|b| *b == b'#').count();
    (1..=6).contains(&hashes) && matches!(line.as_bytes().get(hashes), Some(b' ' | b'\t') | None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doc_ids_are_found_with_word_boundaries() {
        assert_eq!(find_doc_id("AGN-033-foo.md").as_deref(), Some("AGN-033"));
        assert_eq!(find_doc_id("# DDR-101 — Retry").as_deref(), Some("DDR-101"));
        assert_eq!(find_doc_id("xAGN-033"), None);
        assert_eq!(find_doc_id("AGN-0331234"), None);
        assert_eq!(find_doc_id("A-12"), None);
        assert_eq!(find_doc_id("no id here"), None);
    }

    #[test]
    fn tags_come_from_the_header_lines() {
        assert_eq!(
            find_tags("# T\n**Tags:** rag, retrieval ,  context\n"),
            vec!["rag", "retrieval", "context"]
        );
        assert!(find_tags("# T\nnothing").is_empty());
    }

    #[test]
    fn headings_inside_code_fences_do_not_split() {
        let text = "# A\ntext\n```sh\n# not a heading\n```\n## B\nmore";
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(markdown_sections(&lines), vec![(0, 5), (5, 7)]);
    }

    #[test]
    fn a_byte_order_mark_does_not_hide_the_first_heading() {
        let text = "\u{feff}# DDR-107 Retries\n**Tags:** queue\nbody\n## Next\nmore\n";
        let chunks = chunk_file("r", "notes.md", text, &[], ChunkOptions::default()).unwrap();
        assert_eq!(chunks.len(), 2, "split at both headings");
        assert_eq!(chunks[0].doc_id.as_deref(), Some("DDR-107"));
        assert!(
            chunks[0].content.starts_with("# DDR-107"),
            "{:?}",
            chunks[0].content
        );
        assert_eq!(chunks[0].tags, vec!["queue".to_string()]);
    }

    #[test]
    fn unknown_extensions_are_not_indexed() {
        assert!(chunk_file("r", "a.bin", "x", &[], ChunkOptions::default()).is_none());
        assert_eq!(language_for("src/Main.CS"), Some("csharp"));
    }
}
