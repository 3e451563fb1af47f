//! Retrieval scopes (each operator, conditions and-ed, unknown keys) and the composed context
//! block.

use super::rag::*;
use crate::support::{Setup, harness, request};
use aptix_worker::contract::request::{RagCondition, RagOperator};
use aptix_worker::contract::{RequestLimits, parse_request};
use aptix_worker::fake_llm::Reply;
use aptix_worker::rag::{
    Bm25Retriever, ChunkIndex, MemoryIndex, RagBudget, Retriever as _, chunk_file, index_folder,
};
use serde_json::json;
use std::sync::Arc;

pub(super) fn cond(key: &str, operator: RagOperator, values: &[&str]) -> RagCondition {
    RagCondition {
        key: key.into(),
        operator,
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

#[tokio::test]
async fn each_scope_operator_filters_and_conditions_are_anded() {
    for (name, index, _guard) in indexes().await {
        let root = corpus();
        let _c = Cleanup(root.clone());
        index_folder(
            index.as_ref(),
            "t",
            "aptix",
            &root,
            &["team-a".into()],
            opts(),
            |_, _| {},
        )
        .await
        .unwrap();
        let paths = |hits: Vec<(String, usize)>| {
            let mut p: Vec<String> = hits.into_iter().map(|h| h.0).collect();
            p.sort();
            p.dedup();
            p
        };
        // "lease" appears in all three files.
        let q = "lease session queue";
        assert_eq!(
            paths(search(&index, "t", q, vec![]).await).len(),
            3,
            "{name}"
        );
        assert_eq!(
            paths(
                search(
                    &index,
                    "t",
                    q,
                    vec![cond("language", RagOperator::Equals, &["rust"])]
                )
                .await
            ),
            vec!["src/lease.rs"],
            "{name}: =="
        );
        assert_eq!(
            paths(
                search(
                    &index,
                    "t",
                    q,
                    vec![cond("docId", RagOperator::NotEquals, &["AGN-201"])]
                )
                .await
            ),
            vec!["docs/AGN-202-session-leases.md", "src/lease.rs"],
            "{name}: !="
        );
        assert_eq!(
            paths(
                search(
                    &index,
                    "t",
                    q,
                    vec![cond("path", RagOperator::Contains, &["DOCS/"])]
                )
                .await
            ),
            vec![
                "docs/AGN-201-queue-retries.md",
                "docs/AGN-202-session-leases.md"
            ],
            "{name}: contains"
        );
        assert_eq!(
            paths(
                search(
                    &index,
                    "t",
                    q,
                    vec![cond("tags", RagOperator::DoesNotContain, &["queue"])]
                )
                .await
            ),
            vec!["docs/AGN-202-session-leases.md", "src/lease.rs"],
            "{name}: does_not_contain"
        );
        assert_eq!(
            paths(
                search(
                    &index,
                    "t",
                    q,
                    vec![
                        cond("tags", RagOperator::Equals, &["team-a"]),
                        cond("language", RagOperator::Equals, &["markdown"]),
                        cond("docId", RagOperator::Equals, &["AGN-202"]),
                    ]
                )
                .await
            ),
            vec!["docs/AGN-202-session-leases.md"],
            "{name}: ANDed"
        );
        assert!(
            search(
                &index,
                "t",
                q,
                vec![cond("repo", RagOperator::Equals, &["other"])]
            )
            .await
            .is_empty(),
            "{name}"
        );
        // A key chunks do not have is ignored.
        assert_eq!(
            paths(
                search(
                    &index,
                    "t",
                    q,
                    vec![cond("owner", RagOperator::Equals, &["x"])]
                )
                .await
            )
            .len(),
            3
        );
    }
}

#[test]
fn an_unknown_scope_key_is_a_warning_not_an_error() {
    let body = json!({"sessionId": "s", "turnId": "t", "instruction": "x",
        "ragScope": {"conditions": [{"key": "owner", "operator": "==", "values": ["me"]},
                                     {"key": "docId", "operator": "==", "values": ["AGN-1"]}]}});
    let parsed = parse_request(body.to_string().as_bytes(), &RequestLimits::default()).unwrap();
    assert_eq!(parsed.warnings.len(), 1);
    assert_eq!(parsed.warnings[0].error_code.as_str(), "UNKNOWN_RAG_KEY");
    assert!(
        parsed.warnings[0]
            .message
            .starts_with("ragScope.conditions[0].key:"),
        "{}",
        parsed.warnings[0].message
    );
}

/// The `[CONTEXT]` text the fake model received in the user message of call `n`.
fn context_of(h: &crate::support::Harness, n: usize) -> String {
    let reqs = h.fake.requests();
    let input = reqs[n]["input"].as_array().unwrap();
    let user = input.iter().find(|i| i["role"] == "user").unwrap();
    user["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["text"].as_str())
        .find(|t| t.starts_with("[CONTEXT]"))
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn the_composed_block_is_golden_and_the_budget_bounds_it() {
    let root = corpus();
    let _c = Cleanup(root.clone());
    let index: Arc<dyn ChunkIndex> = Arc::new(MemoryIndex::new());
    index_folder(
        index.as_ref(),
        "local",
        "aptix",
        &root,
        &[],
        opts(),
        |_, _| {},
    )
    .await
    .unwrap();
    let h = harness(Setup::default()).await;
    let budget = RagBudget {
        max_chunks: 2,
        max_chars: 10_000,
    };
    let pipeline = h
        .pipeline
        .clone()
        .with_rag(Arc::new(Bm25Retriever::new(index.clone())), budget);
    h.fake
        .push([Reply::Text("ok".into()), Reply::Text("ok".into())]);
    let turn = request(json!({
        "sessionId": "s", "turnId": "t1",
        "instruction": "Check the session fencing token and lease renewal rules",
        "inputArtifacts": [{"relativePath": "notes/todo.md", "fileName": "todo.md",
                            "contents": "- check leases\n", "origin": "user"}],
        "ragScope": {"conditions": [{"key": "docId", "operator": "==", "values": ["AGN-202"]}]}
    }));
    pipeline.run(&turn).await.unwrap();
    let expected = "[CONTEXT]

=== CHUNK 1 ===
Id: artifact_1
Path: notes/todo.md
Lines: 1-1
Language: markdown
```markdown
- check leases
```

=== CHUNK 2 ===
Id: ID_A
Path: docs/AGN-202-session-leases.md
Lines: 6-8
Language: markdown
```markdown
## Decision
A worker takes the session lease with a fencing token before running a turn. Lease renewal
happens every third of the lease time; a stale fencing token makes every write fail.
```

=== CHUNK 3 ===
Id: ID_B
Path: docs/AGN-202-session-leases.md
Lines: 1-4
Language: markdown
```markdown
# AGN-202 Session leases
**Tags:** state, redis

Only one turn of a session runs at a time.
```

";
    let ids: Vec<String> = {
        let all = chunk_file(
            "aptix",
            "docs/AGN-202-session-leases.md",
            LEASE_DOC,
            &[],
            opts(),
        )
        .unwrap();
        vec![all[1].id.clone(), all[0].id.clone()]
    };
    let expected = expected.replace("ID_A", &ids[0]).replace("ID_B", &ids[1]);
    assert_eq!(context_of(&h, 0), expected);

    // A character budget that fits only the best chunk: the others are cut (and logged).
    let decision = &chunk_file(
        "aptix",
        "docs/AGN-202-session-leases.md",
        LEASE_DOC,
        &[],
        opts(),
    )
    .unwrap()[1];
    let tight = RagBudget {
        max_chunks: 5,
        max_chars: decision.content.chars().count() + 10,
    };
    let pipeline = h
        .pipeline
        .clone()
        .with_rag(Arc::new(Bm25Retriever::new(index)), tight);
    let turn = request(json!({"sessionId": "s2", "turnId": "t1",
        "instruction": "fencing token lease renewal session queue"}));
    pipeline.run(&turn).await.unwrap();
    let block = context_of(&h, 1);
    assert_eq!(block.matches("=== CHUNK ").count(), 1, "{block}");
    assert!(block.contains(&format!("Id: {}\n", decision.id)), "{block}");
}

/// With the index on the session store's Redis, a turn of a tenant without an index does not
/// read the index: the begin step looks whether the tenant has one. Nothing is remembered of
/// an absent index, so the tenant's first turn after indexing gets its chunks, and so does
/// every turn after (the tenant now known to have an index, read beside the begin step).
#[tokio::test]
async fn a_tenant_gets_retrieved_context_on_its_first_turn_after_indexing() {
    let root = corpus();
    let _c = Cleanup(root.clone());
    let h = harness(Setup {
        store: crate::support::StoreKind::Redis,
        ..Setup::default()
    })
    .await;
    let ns = h._redis.as_ref().unwrap().store.namespace().to_string();
    let index: Arc<dyn ChunkIndex> = Arc::new(
        aptix_worker::rag::RedisIndex::connect(&crate::support::redis_url(), &ns)
            .await
            .unwrap(),
    );
    assert_eq!(
        Bm25Retriever::new(index.clone()).absence_probe("local"),
        Some(format!("{ns}:rag:{{local}}:stats")),
        "the index names the key the begin step looks for"
    );
    let pipeline = h
        .pipeline
        .clone()
        .with_rag(
            Arc::new(Bm25Retriever::new(index.clone())),
            RagBudget::default(),
        )
        .with_rag_on_store();
    h.fake.push([
        Reply::Text("ok".into()),
        Reply::Text("ok".into()),
        Reply::Text("ok".into()),
    ]);
    let asked = |s: &str| {
        request(json!({"sessionId": s, "turnId": "t1",
            "instruction": "fencing token lease renewal"}))
    };
    pipeline.run(&asked("before")).await.unwrap();
    assert_eq!(context_of(&h, 0), "", "no index, no context block");
    index_folder(
        index.as_ref(),
        "local",
        "aptix",
        &root,
        &[],
        opts(),
        |_, _| {},
    )
    .await
    .unwrap();
    pipeline.run(&asked("after")).await.unwrap();
    let block = context_of(&h, 1);
    assert!(block.contains("docs/AGN-202-session-leases.md"), "{block}");
    pipeline.run(&asked("again")).await.unwrap();
    assert_eq!(
        context_of(&h, 2),
        block,
        "read beside the begin step, the same"
    );
}
