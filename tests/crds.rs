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
