//! The per-tenant Redis user of docs/explanation/security.md on real masters. The page's own `ACL SETUSER` line
//! is read from the page, so that what users are told to run and what is tested cannot drift apart: with it,
//! `lock` gets every command it sends on keys of the tenant's prefix (single attempts held across extensions, a
//! waiter woken from the fair queue, semaphores), and none on another tenant's.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{BIN, SHORT, run, start_cluster, stderr};
use crate::support::redis_server::{Options, RedisServer, raw_command};

const PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/explanation/security.md");

/// What the page writes where the tenant's password goes.
const PLACEHOLDER: &str = ">TEAM_A_PASSWORD";
const USER: &str = "team-a";
const PASSWORD: &str = "team-a-S3cret.pw";

/// The page's one `ACL SETUSER` line, word by word, with `password_rule` (`>password` or `#sha256`) in place of
/// the placeholder.
fn acl_line(password_rule: &str) -> Vec<String> {
    let page = std::fs::read_to_string(PAGE).expect("the security page");
    let lines: Vec<&str> = page
        .lines()
        .filter(|line| line.starts_with("ACL SETUSER "))
        .collect();
    assert_eq!(lines.len(), 1, "the page gives one ACL SETUSER line: {lines:?}");
    let words: Vec<String> = lines[0].split_whitespace().map(str::to_owned).collect();
    assert_eq!(words.get(2).map(String::as_str), Some(USER), "{words:?}");
    assert!(words.iter().any(|word| word == PLACEHOLDER), "{words:?}");
    words
        .into_iter()
        .map(|word| {
            if word == PLACEHOLDER {
                password_rule.to_owned()
            } else {
                word
            }
        })
        .collect()
}

/// The password rule that puts a password's SHA-256 in a configuration instead of the password itself.
fn hashed_password() -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, PASSWORD.as_bytes());
    format!("#{}", hex::encode(digest.as_ref()))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The tenant's credentials, in files as a mounted Secret gives them.
struct Credentials {
    dir: tempfile::TempDir,
}

impl Credentials {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("username"), format!("{USER}\n")).expect("user name file");
        std::fs::write(dir.path().join("password"), format!("{PASSWORD}\n")).expect("password file");
        Self { dir }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// `lock` as the tenant on `urls` (which carry no credentials).
fn as_tenant(urls: &[String], credentials: &Credentials, extra: &[&str], command: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("lock")
        .env("REDLOCK_REDIS", urls.join(","))
        .env_remove("RUST_LOG")
        .args(SHORT)
        .arg("--redis-username-file")
        .arg(credentials.file("username"))
        .arg("--redis-password-file")
        .arg(credentials.file("password"))
        .args(extra)
        .arg("--")
        .args(command);
    cmd
}

/// Starts `cmd` (whose command prints `started` first) and returns once its command runs.
fn started(mut cmd: Command) -> Child {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("a holder");
    let stdout = child.stdout.take().expect("its stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("its first line");
    assert_eq!(line.trim(), "started", "the holder runs its command");
    child
}

fn succeeded(child: Child) {
    let output = child.wait_with_output().expect("the holder ends");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

/// Every string in a reply, nested arrays and maps included.
fn texts(value: &redis::Value) -> Vec<String> {
    match value {
        redis::Value::BulkString(bytes) => vec![String::from_utf8_lossy(bytes).into_owned()],
        redis::Value::SimpleString(text) => vec![text.clone()],
        redis::Value::Array(items) | redis::Value::Set(items) => items.iter().flat_map(texts).collect(),
        redis::Value::Map(pairs) => pairs
            .iter()
            .flat_map(|(key, value)| texts(key).into_iter().chain(texts(value)))
            .collect(),
        _ => Vec::new(),
    }
}

/// The entries of an `ACL LOG` reply, each as its strings, but for the `CLIENT SETINFO` the client sends on
/// Redis 7.2 and later and ignores when refused (the page says so; Redis 7.0 refuses the rule that allows it).
fn refusals(log: &redis::Value) -> Vec<Vec<String>> {
    let redis::Value::Array(entries) = log else {
        return vec![texts(log)];
    };
    entries
        .iter()
        .map(texts)
        .filter(|entry| !entry.iter().any(|text| text == "client|setinfo"))
        .collect()
}

/// One command as the tenant, straight to a master: its error text, if refused.
async fn refused_as_tenant(port: u16, args: &[&str]) -> Option<String> {
    let client = redis::Client::open(format!("redis://{USER}:{PASSWORD}@127.0.0.1:{port}")).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("the tenant logs in");
    let mut command = redis::cmd(args[0]);
    for arg in &args[1..] {
        command.arg(*arg);
    }
    command
        .query_async::<redis::Value>(&mut conn)
        .await
        .err()
        .map(|err| err.to_string())
}

#[test]
fn a_tenant_user_locks_the_keys_of_its_prefix_and_nothing_else() {
    let cluster = start_cluster();
    let urls = cluster.urls();
    let rt = runtime();
    let line = acl_line(&format!(">{PASSWORD}"));
    let line: Vec<&str> = line.iter().map(String::as_str).collect();
    for url in &urls {
        let answer = rt.block_on(raw_command(url, &line));
        assert_eq!(answer, redis::Value::Okay, "ACL SETUSER on {url}");
        rt.block_on(raw_command(url, &["ACL", "LOG", "RESET"]));
    }
    let credentials = Credentials::new();

    // A single attempt, held across extensions (a third of the 1 s TTL each).
    let output = run(as_tenant(
        &urls,
        &credentials,
        &["team-a/nightly"],
        &["sleep", "0.8"],
    ));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

    // A waiter in the fair queue, woken by the holder's release.
    let holder = started(as_tenant(
        &urls,
        &credentials,
        &["team-a/queue"],
        &["sh", "-c", "echo started; sleep 1"],
    ));
    let output = run(as_tenant(
        &urls,
        &credentials,
        &["--wait", "10s", "team-a/queue"],
        &["true"],
    ));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("next in the queue"),
        "it waited in the queue: {}",
        stderr(&output)
    );
    succeeded(holder);

    // A semaphore of 2 with both permits held and a third waiting, on a resource with a hash tag of its own.
    let semaphore = ["--permits", "2", "team-a/{batch}"];
    let holders: Vec<Child> = (0..2)
        .map(|_| {
            started(as_tenant(
                &urls,
                &credentials,
                &semaphore,
                &["sh", "-c", "echo started; sleep 1"],
            ))
        })
        .collect();
    let output = run(as_tenant(
        &urls,
        &credentials,
        &[&["--wait", "10s"][..], &semaphore].concat(),
        &["true"],
    ));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains("waiting for"), "{}", stderr(&output));
    holders.into_iter().for_each(succeeded);

    // A hundred permits: each attempt names every permit key (1 to 99) and its counter.
    let output = run(as_tenant(
        &urls,
        &credentials,
        &["--permits", "100", "team-a/wide"],
        &["true"],
    ));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

    // Nothing `lock` sent was refused: no command, key or channel.
    for url in &urls {
        let log = refusals(&rt.block_on(raw_command(url, &["ACL", "LOG"])));
        assert!(log.is_empty(), "{url} refused: {log:?}");
    }

    // Another tenant's key: refused by every master, and `lock` says so.
    let output = run(as_tenant(
        &urls,
        &credentials,
        &["-v", "team-b/nightly"],
        &["true"],
    ));
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(69), "{err}");
    assert!(err.contains("too few masters reachable"), "{err}");
    assert!(
        err.contains("NoPerm: this user has no permissions to access one of the keys"),
        "{err}"
    );
    let log = texts(&rt.block_on(raw_command(&urls[0], &["ACL", "LOG"])));
    assert!(
        log.iter().any(|text| text == "team-b/nightly") && log.iter().any(|text| text == USER),
        "{log:?}"
    );

    // Nor anything else: another tenant's counter, administration, listing keys.
    let port = cluster[0].port();
    for args in [
        &["GET", "{team-b/nightly}:token"][..],
        &["GET", "permit:1:team-b/x:team-a/y"],
        &["FLUSHALL"],
        &["KEYS", "*"],
        &["CONFIG", "GET", "maxmemory-policy"],
        &["ACL", "LIST"],
    ] {
        let refused = rt.block_on(refused_as_tenant(port, args));
        assert!(
            refused
                .as_deref()
                .is_some_and(|err| err.contains("NoPerm") || err.contains("NOPERM")),
            "{args:?}: {refused:?}"
        );
    }
}

/// The same rules at the master's start (`redis-server --user …`, with the password's SHA-256): how the chart's
/// `redis.extraArgs` gives its embedded masters, whose `ACL` command is disabled, a tenant's user.
#[test]
fn the_same_rules_work_as_redis_server_arguments() {
    let rules = acl_line(&hashed_password());
    let extra_args: Vec<String> = std::iter::once("--user".to_owned())
        .chain(rules.into_iter().skip(2))
        .collect();
    let master = RedisServer::start_with(Options {
        extra_args,
        ..Options::default()
    })
    .expect("a master with the tenant's user");
    std::thread::sleep(Duration::from_millis(3_100));
    let urls = [master.url()];
    let credentials = Credentials::new();
    let output = run(as_tenant(&urls, &credentials, &["team-a/nightly"], &["true"]));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let output = run(as_tenant(&urls, &credentials, &["team-b/nightly"], &["true"]));
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
}
