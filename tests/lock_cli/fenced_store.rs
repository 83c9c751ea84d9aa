//! Issue 40, item 3: a store outside Kubernetes that refuses a stale holder, from `lock`'s command: the Redis
//! recipe (`examples/fenced-store/fenced-set.lua` through `fenced-write.sh`) and the SQL statement
//! (`fenced-upsert.sql`, run here on SQLite), exactly as the docs ship them. A holder paused past its validity
//! writes, once it runs again, with the token it was given; that write is made here directly with an earlier
//! run's token, after a later run wrote: what the store answers does not depend on when the pause ended.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{SHORT, lock, run, start_cluster, stderr};
use crate::support::redis_server::RedisServer;

fn recipe(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/fenced-store")
        .join(file)
}

/// The store's value and the highest token written to it.
fn stored(store: &RedisServer, key: &str) -> (Option<String>, Option<i64>) {
    let client = redis::Client::open(store.url()).expect("store URL");
    let mut conn = client.get_connection().expect("store connection");
    let (value, token): (Option<String>, Option<String>) = redis::cmd("MGET")
        .arg(key)
        .arg(format!("{key}:fencing-token"))
        .query(&mut conn)
        .expect("MGET");
    (value, token.map(|token| token.parse().expect("a decimal token")))
}

fn write_under_lock(cluster: &super::RedisCluster, store: &RedisServer, key: &str, value: &str) -> Output {
    let script = recipe("fenced-write.sh");
    let mut cmd = lock(
        cluster,
        &[SHORT, &["fenced-report"]].concat(),
        &[script.to_str().expect("UTF-8 path"), key, value],
    );
    cmd.env("STORE_URL", store.url());
    run(cmd)
}

#[test]
fn a_redis_store_refuses_a_write_with_a_token_below_one_it_has_seen() {
    let cluster = start_cluster();
    let store = RedisServer::start().expect("store");
    let key = "{report}";

    let first = write_under_lock(&cluster, &store, key, "first");
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let (value, Some(first_token)) = stored(&store, key) else {
        panic!("the first write recorded no token");
    };
    assert_eq!(value.as_deref(), Some("first"));

    let second = write_under_lock(&cluster, &store, key, "second");
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    let (value, Some(second_token)) = stored(&store, key) else {
        panic!("the second write recorded no token");
    };
    assert_eq!(value.as_deref(), Some("second"));
    assert!(second_token > first_token, "{first_token} then {second_token}");

    // The first holder, paused past its validity, writes with its own token once it runs again.
    let stale = run({
        let mut cmd = Command::new(recipe("fenced-write.sh"));
        cmd.args([key, "stale"])
            .env("STORE_URL", store.url())
            .env("REDLOCK_FENCING_TOKEN", first_token.to_string())
            .env_remove("REDLOCK_FENCING_TOKEN_FILE");
        cmd
    });
    let err = stderr(&stale);
    assert_eq!(stale.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "STALE fencing token {first_token} is below {second_token}"
        )),
        "the refusal names both tokens: {err}"
    );
    assert_eq!(stored(&store, key), (Some("second".into()), Some(second_token)));

    // Through the token file, re-read at the write: the next holder writes.
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut cmd = lock(
        &cluster,
        &[SHORT, &["fenced-report"]].concat(),
        &[
            recipe("fenced-write.sh").to_str().expect("UTF-8 path"),
            key,
            "third",
        ],
    );
    cmd.env("STORE_URL", store.url())
        .env("REDLOCK_FENCING_TOKEN_FILE", dir.path().join("token"));
    let third = run(cmd);
    assert_eq!(third.status.code(), Some(0), "{}", stderr(&third));
    let (value, third_token) = stored(&store, key);
    assert_eq!(value.as_deref(), Some("third"));
    assert!(third_token > Some(second_token), "{third_token:?}");

    // A token that is not digits, and tokens past 2^53 (compared as decimals, not rounded).
    for (token, refused) in [
        ("12a", "ERR"),
        ("9007199254740993", ""),
        ("9007199254740992", "STALE"),
    ] {
        let output = run({
            let mut cmd = Command::new(recipe("fenced-write.sh"));
            cmd.args(["{big}", token])
                .env("STORE_URL", store.url())
                .env("REDLOCK_FENCING_TOKEN", token)
                .env_remove("REDLOCK_FENCING_TOKEN_FILE");
            cmd
        });
        let err = stderr(&output);
        if refused.is_empty() {
            assert_eq!(output.status.code(), Some(0), "{token}: {err}");
        } else {
            assert_eq!(output.status.code(), Some(1), "{token}: {err}");
            assert!(err.contains(refused), "{token}: {err}");
        }
    }
    assert_eq!(stored(&store, "{big}").0.as_deref(), Some("9007199254740993"));
}

/// `fenced-upsert.sql` with `:token` bound, as a holder's command runs it: the number of rows it changed.
fn upsert(db: &Path, body: &str, token: &str) -> Command {
    let mut cmd = Command::new("sqlite3");
    cmd.arg(db)
        .arg(".parameter set :name 'report'")
        .arg(format!(".parameter set :body '{body}'"))
        .arg(format!(".parameter set :token {token}"))
        .arg(format!(".read {}", recipe("fenced-upsert.sql").display()))
        .arg("SELECT changes();");
    cmd
}

fn row(db: &Path) -> String {
    let output = run({
        let mut cmd = Command::new("sqlite3");
        cmd.arg(db)
            .arg("SELECT body, fencing_token FROM reports WHERE name = 'report';");
        cmd
    });
    assert!(output.status.success(), "{}", stderr(&output));
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[test]
fn the_sql_recipe_changes_no_row_for_a_token_below_the_rows() {
    let cluster = start_cluster();
    let dir = tempfile::tempdir().expect("temporary directory");
    let db = dir.path().join("store.db");
    let mut tokens = Vec::new();
    for body in ["first", "second"] {
        // The holder's command binds the token `lock` gave it.
        let mut cmd = lock(
            &cluster,
            &[SHORT, &["fenced-sql"]].concat(),
            &[
                "sh",
                "-c",
                r#"sqlite3 "$DB" ".parameter set :name 'report'" ".parameter set :body '$BODY'" ".parameter set :token $REDLOCK_FENCING_TOKEN" ".read $SQL" "SELECT changes();" && printf ' %s' "$REDLOCK_FENCING_TOKEN""#,
            ],
        );
        cmd.env("DB", &db)
            .env("BODY", body)
            .env("SQL", recipe("fenced-upsert.sql"));
        let output = run(cmd);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let fields: Vec<&str> = stdout.split_whitespace().collect();
        assert_eq!(fields.first(), Some(&"1"), "one row written: {stdout}");
        let token: i64 = fields
            .get(1)
            .and_then(|token| token.parse().ok())
            .expect("the token");
        assert_eq!(row(&db), format!("{body}|{token}"));
        tokens.push(token);
    }
    let (first, second) = (tokens[0], tokens[1]);
    assert!(second > first, "{tokens:?}");

    // The first holder, paused, writes with its own token: no row changes.
    let stale = run(upsert(&db, "stale", &first.to_string()));
    assert!(stale.status.success(), "{}", stderr(&stale));
    assert_eq!(String::from_utf8_lossy(&stale.stdout).trim(), "0");
    assert_eq!(row(&db), format!("second|{second}"));
    // The same holder writing again with its own token is accepted.
    let again = run(upsert(&db, "second, again", &second.to_string()));
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).trim(),
        "1",
        "{}",
        stderr(&again)
    );
}
