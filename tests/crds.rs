//! `crds/` is generated from the Rust types; this fails when it is stale.

use std::path::Path;

use redlock_operator::api::crd_documents;

#[test]
fn crds_directory_matches_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let documents = crd_documents().expect("render CRDs");
    let mut stale = Vec::new();
    for (name, yaml) in &documents {
        let on_disk = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        if &on_disk != yaml {
            stale.push(name.to_string());
        }
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("crds/ exists")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    names.sort();
    let mut expected: Vec<String> = documents.iter().map(|(name, _)| name.to_string()).collect();
    expected.sort();
    assert_eq!(names, expected, "crds/ holds exactly the generated CRDs");
    assert!(
        stale.is_empty(),
        "crds/ is stale for {stale:?}: run `cargo run -- crd --write crds` and commit the result"
    );
}

#[test]
fn crds_carry_validation_and_columns() {
    let documents = crd_documents().expect("render CRDs");
    let lock = &documents
        .iter()
        .find(|(name, _)| name.starts_with("distributedlocks"))
        .expect("lock CRD")
        .1;
    for expected in [
        "set exactly one of holder.identity, holder.leaderElection and holder.jobs",
        "resourceKey is immutable",
        "ttl must be between 100ms and 1h",
        "shortNames:\n    - dlock",
        "name: Holder",
        "name: Valid-Until",
        "name: Held",
        "subresources:\n      status: {}",
    ] {
        assert!(
            lock.contains(expected),
            "DistributedLock CRD lacks {expected:?}:\n{lock}"
        );
    }
    let quorum = &documents
        .iter()
        .find(|(name, _)| name.starts_with("redisquorums"))
        .expect("quorum CRD")
        .1;
    for expected in [
        "scope: Cluster",
        "put credentials in spec.auth",
        "x-kubernetes-list-type: set",
        "minItems: 1",
    ] {
        assert!(
            quorum.contains(expected),
            "RedisQuorum CRD lacks {expected:?}:\n{quorum}"
        );
    }
}

/// The `format`s the API server knows (`kubectl apply` warns `unrecognized format` on any other): for integers
/// and numbers these, for strings the list in `JSONSchemaProps.format`'s documentation, compared the way the API
/// server compares them (without hyphens, so `date-time` is `datetime`).
fn format_is_known(schema_type: &str, format: &str) -> bool {
    const STRING_FORMATS: [&str; 24] = [
        "bsonobjectid",
        "uri",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "cidr",
        "mac",
        "uuid",
        "uuid3",
        "uuid4",
        "uuid5",
        "isbn",
        "isbn10",
        "isbn13",
        "creditcard",
        "ssn",
        "hexcolor",
        "rgbcolor",
        "byte",
        "password",
        "date",
        "duration",
        "datetime",
    ];
    match schema_type {
        "integer" => matches!(format, "int32" | "int64"),
        "number" => matches!(format, "float" | "double"),
        "string" => STRING_FORMATS.contains(&format.replace('-', "").as_str()),
        _ => false,
    }
}

/// Whether `description` breaks a line inside a paragraph: `kubectl explain` shows such a break where the doc
/// comment happened to wrap, in mid-sentence. Blank lines between paragraphs and a line break before a list item
/// are kept on purpose.
fn breaks_a_paragraph(description: &str) -> bool {
    let lines: Vec<&str> = description.split('\n').collect();
    lines.windows(2).any(|pair| {
        let next = pair[1].trim_start();
        let starts_item = next.starts_with("- ")
            || next.starts_with("* ")
            || next
                .split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        !pair[0].trim().is_empty() && !next.is_empty() && !starts_item
    })
}

/// Every schema node below `value`, with its path, for the checks below.
fn walk<'a>(value: &'a serde_json::Value, path: String, found: &mut Vec<(String, &'a serde_json::Value)>) {
    match value {
        serde_json::Value::Object(map) => {
            found.push((path.clone(), value));
            for (key, child) in map {
                walk(child, format!("{path}.{key}"), found);
            }
        }
        serde_json::Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                walk(child, format!("{path}[{index}]"), found);
            }
        }
        _ => {}
    }
}

#[test]
fn crds_use_only_formats_kubernetes_knows_and_one_line_paragraphs() {
    use redlock_operator::api::{DistributedLock, RedisQuorum};
    let mut problems = Vec::new();
    for crd in [
        redlock_operator::api::served_crd::<DistributedLock>(),
        redlock_operator::api::served_crd::<RedisQuorum>(),
    ] {
        let crd = serde_json::to_value(&crd).expect("CRD as JSON");
        let name = crd["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let mut nodes = Vec::new();
        walk(&crd["spec"], name, &mut nodes);
        for (path, node) in nodes {
            if let Some(format) = node.get("format").and_then(|format| format.as_str()) {
                let schema_type = node.get("type").and_then(|t| t.as_str()).unwrap_or_default();
                if !format_is_known(schema_type, format) {
                    problems.push(format!(
                        "{path}: type {schema_type:?} with unknown format {format:?}"
                    ));
                }
            }
            if let Some(description) = node.get("description").and_then(|d| d.as_str())
                && breaks_a_paragraph(description)
            {
                problems.push(format!("{path}: description breaks a paragraph: {description:?}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checks_above_catch_what_they_are_for() {
    assert!(!format_is_known("integer", "uint32"));
    assert!(format_is_known("integer", "int32"));
    assert!(format_is_known("string", "date-time"));
    assert!(!format_is_known("string", "regex"));
    assert!(breaks_a_paragraph("Two locks naming the same key\ncontend."));
    assert!(!breaks_a_paragraph("One paragraph.\n\nAnother one."));
    assert!(!breaks_a_paragraph("A list:\n- one\n- two\n1. three"));
}
