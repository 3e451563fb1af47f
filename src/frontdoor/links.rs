//! The OpenAPI document's links: from what a submission answers (the 202 of `POST /v1/turns`,
//! of `POST /v1/batches` and of a batch's retry) to the operations on what it created, with
//! the runtime expressions that fill their path parameters.
//!
//! Owns: the links and putting them into the served document. Must not: describe operations
//! (the routes' derives do).

/// A link from what a submission answers to an operation on what it created.
struct Link {
    /// The submission: path, method and status of its answer.
    path: &'static str,
    method: &'static str,
    status: &'static str,
    /// The link's name and the operation it leads to.
    name: &'static str,
    operation: &'static str,
    /// Each path parameter of the operation, with the runtime expression that fills it.
    parameters: &'static [(&'static str, &'static str)],
}

const fn link(
    path: &'static str,
    name: &'static str,
    operation: &'static str,
    parameters: &'static [(&'static str, &'static str)],
) -> Link {
    Link {
        path,
        method: "post",
        status: "202",
        name,
        operation,
        parameters,
    }
}

/// A client generator (and a stateful fuzzer) learns from these that the 202 of
/// `POST /v1/turns` names the turn that `GET`/`cancel` take, instead of guessing ids that do
/// not exist.
const LINKS: &[Link] = &[
    link("/v1/turns", "GetTurn", "get_turn", TURN),
    link("/v1/turns", "CancelTurn", "cancel_turn", TURN),
    link("/v1/turns", "GetSession", "get_session", SESSION),
    link("/v1/batches", "GetBatch", "get_batch", BATCH),
    link("/v1/batches", "GetBatchResults", "get_batch_results", BATCH),
    link("/v1/batches", "CancelBatch", "cancel_batch", BATCH),
    link("/v1/batches", "RetryBatch", "retry_batch", BATCH),
    link(
        "/v1/batches/{batchId}/retry",
        "GetBatch",
        "get_batch",
        BATCH,
    ),
    link(
        "/v1/batches/{batchId}/retry",
        "GetBatchResults",
        "get_batch_results",
        BATCH,
    ),
];
const TURN: &[(&str, &str)] = &[
    ("sessionId", "$response.body#/result/sessionId"),
    ("turnId", "$response.body#/result/turnId"),
];
const SESSION: &[(&str, &str)] = &[("sessionId", "$response.body#/result/sessionId")];
const BATCH: &[(&str, &str)] = &[("batchId", "$response.body#/result/batchId")];

/// Puts [`LINKS`] into the served document's responses, beside what the derive wrote.
pub fn add_links(doc: &mut serde_json::Value) {
    for l in LINKS {
        let pointer = format!(
            "/paths/{}/{}/responses/{}",
            l.path.replace('/', "~1"),
            l.method,
            l.status
        );
        let Some(response) = doc
            .pointer_mut(&pointer)
            .and_then(serde_json::Value::as_object_mut)
        else {
            continue;
        };
        let parameters: serde_json::Map<String, serde_json::Value> = l
            .parameters
            .iter()
            .map(|(p, e)| (p.to_string(), serde_json::Value::from(*e)))
            .collect();
        let links = response
            .entry("links")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(links) = links.as_object_mut() {
            links.insert(
                l.name.to_string(),
                serde_json::json!({"operationId": l.operation, "parameters": parameters}),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every link names an operation the document has, with exactly the path parameters
    /// that operation takes, read from a property the linked response's schema has.
    #[test]
    fn every_link_leads_to_an_operation_with_its_path_parameters() {
        let doc = crate::frontdoor::http::openapi();
        let operations: Vec<(&str, &serde_json::Value)> = doc["paths"]
            .as_object()
            .into_iter()
            .flatten()
            .flat_map(|(path, ops)| {
                ops.as_object()
                    .into_iter()
                    .flatten()
                    .map(move |(_, op)| (path.as_str(), op))
            })
            .collect();
        let mut seen = 0;
        for l in LINKS {
            let (path, method, status, name, operation) =
                (l.path, l.method, l.status, l.name, l.operation);
            let link = &doc["paths"][path][method]["responses"][status]["links"][name];
            assert_eq!(link["operationId"], *operation, "{name} missing: {link}");
            let (target, op) = operations
                .iter()
                .find(|(_, op)| op["operationId"] == *operation)
                .unwrap_or_else(|| panic!("{name}: no operation {operation}"));
            let mut wanted: Vec<&str> = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "path")
                .filter_map(|p| p["name"].as_str())
                .collect();
            let mut given: Vec<&str> = l.parameters.iter().map(|(p, _)| *p).collect();
            wanted.sort();
            given.sort();
            assert_eq!(given, wanted, "{name} -> {target}");
            assert!(target.starts_with("/v1/"), "{target}");
            // The expression reads `result.<field>` of the envelope the 202 answers with.
            let schema_ref = doc["paths"][path][method]["responses"][status]["content"]
                ["application/json"]["schema"]["$ref"]
                .as_str()
                .unwrap_or_default()
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string();
            let result = &doc["components"]["schemas"][&schema_ref]["properties"]["result"];
            for (_, expr) in l.parameters {
                let field = expr.rsplit('/').next().unwrap_or_default();
                assert!(
                    !result["properties"][field].is_null(),
                    "{name}: {expr} is not in {schema_ref}: {result}"
                );
            }
            seen += 1;
        }
        assert_eq!(seen, LINKS.len());
    }
}
