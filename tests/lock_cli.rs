//! `redlock-operator lock` end to end: the real binary against real masters.

#[path = "lock_cli/acl_user.rs"]
mod acl_user;
#[path = "lock_cli/fair_order.rs"]
mod fair_order;
#[path = "lock_cli/fenced_store.rs"]
mod fenced_store;
#[path = "lock_cli/fresh_attempts.rs"]
mod fresh_attempts;
#[path = "lock_cli/permits.rs"]
mod permits;
#[path = "lock_cli/static_binary.rs"]
mod static_binary;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::redis_server::RedisCluster;

const BIN: &str = env!("CARGO_BIN_EXE_redlock-operator");

fn lock(cluster: &RedisCluster, extra: &[&str], command: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("lock")
        .env("REDLOCK_REDIS", cluster.urls().join(","))
        .env_remove("RUST_LOG")
        .args(extra)
        .arg("--")
        .args(command);
    cmd
}

fn run(mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run redlock-operator")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Fresh masters sit in quarantine for max-ttl; every test here uses `--max-ttl` of at most 1s and waits it
/// out once. Reported uptime can be a second ahead of the real one, so only a reported 3s proves 1.012s.
fn start_cluster() -> RedisCluster {
    let cluster = RedisCluster::start(5).expect("masters");
    std::thread::sleep(Duration::from_millis(3_100));
    cluster
}

const SHORT: &[&str] = &["--ttl", "1s", "--max-ttl", "1s"];

#[test]
fn runs_the_command_with_the_lock_environment_and_returns_its_status() {
    let cluster = start_cluster();
    let mut args = SHORT.to_vec();
    args.extend(["--holder", "batch-7", "-v", "nightly-report"]);
    let output = run(lock(
        &cluster,
        &args,
        &[
            "sh",
            "-c",
            "echo \"$REDLOCK_RESOURCE $REDLOCK_HOLDER $REDLOCK_VALIDITY_MS\" \"${REDLOCK_REDIS:-no-credentials}\"; exit 3",
        ],
    ));
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(&fields[..2], ["nightly-report", "batch-7"]);
    assert_eq!(
        fields[3], "no-credentials",
        "the masters' URLs (and their passwords) are not passed on"
    );
    let validity: u64 = fields[2].parse().expect("validity in ms");
    assert!(validity > 0 && validity < 1_000, "{validity}");
    let err = stderr(&output);
    assert!(
        err.contains("acquire: ") && err.contains("granted"),
        "-v prints per-master outcomes: {err}"
    );
    assert!(err.contains("release: "), "{err}");
    assert!(
        !err.contains("batch-7|"),
        "the lock value's secret is never printed"
    );

    // Released on exit: the next run gets it at once.
    let output = run(lock(&cluster, &[SHORT, &["nightly-report"]].concat(), &["true"]));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn contended_lock_exits_75_after_waiting() {
    let cluster = start_cluster();
    let mut holder = lock(
        &cluster,
        &["--ttl", "1s", "--max-ttl", "1s", "--holder", "first", "busy"],
        &["sh", "-c", "echo started; sleep 3"],
    );
    let mut holder = holder.stdout(Stdio::piped()).spawn().expect("holder");
    let mut line = String::new();
    let stdout = holder.stdout.take().expect("stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("started");
    assert_eq!(line.trim(), "started");

    let output = run(lock(&cluster, &[SHORT, &["busy"]].concat(), &["true"]));
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    assert!(stderr(&output).contains("held by first"), "{}", stderr(&output));
    // `--wait 0`, as the help has it: a single attempt.
    let output = run(lock(
        &cluster,
        &[SHORT, &["--wait", "0", "busy"]].concat(),
        &["true"],
    ));
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    assert!(stderr(&output).contains("after 1 attempt"), "{}", stderr(&output));

    let started = Instant::now();
    let output = run(lock(
        &cluster,
        &[SHORT, &["--wait", "600ms", "busy"]].concat(),
        &["true"],
    ));
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "it waited before giving up"
    );

    // Once the holder is done, a waiting run gets the lock.
    let output = run(lock(
        &cluster,
        &[SHORT, &["--wait", "10s", "busy"]].concat(),
        &["true"],
    ));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(holder.wait().expect("holder").success());

    // Every duration flag takes Go's (and Kubernetes') spellings.
    let go_spellings = [
        "--ttl",
        "1.0s",
        "--max-ttl",
        "1000ms",
        "--node-timeout",
        "50000us",
        "--fence-margin",
        ".2s",
        "--wait",
        "0",
        "busy",
    ];
    let output = run(lock(&cluster, &go_spellings, &["true"]));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn bad_usage_exits_64_with_one_line() {
    let cluster = start_cluster();
    let cases: Vec<Vec<&str>> = vec![
        vec!["--redis", "localhost:6379", "r"],
        vec!["--redis", "rediss://127.0.0.1:6380#insecure", "r"],
        vec!["--ttl", "1s", "--node-timeout", "200ms", "r"],
        vec!["--ttl", "0s", "r"],
        vec!["--ttl", "2m", "--max-ttl", "1m", "r"],
        vec!["--ttl", "ten seconds", "r"],
        vec!["--ttl", "1000.5ms", "r"],
        vec!["--wait", "5", "r"],
        vec!["--wait=-1s", "r"],
        vec!["--wait", "2562048h", "r"],
        vec!["--no-such-flag", "r"],
        vec![""],
    ];
    for args in cases {
        let output = run(lock(&cluster, &args, &["true"]));
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {err}");
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{args:?}: one clear line, got {err}"
        );
        assert!(!err.contains("panicked") && !err.contains("backtrace"), "{err}");
    }
    // No masters at all.
    let output = run({
        let mut cmd = Command::new(BIN);
        cmd.args(["lock", "r", "--", "true"]).env_remove("REDLOCK_REDIS");
        cmd
    });
    assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
    // Passwords given in URLs never show in messages.
    let output = run(lock(&cluster, &["--redis", "redis://u:hunter2@", "r"], &["true"]));
    assert_eq!(output.status.code(), Some(64));
    assert!(!stderr(&output).contains("hunter2"), "{}", stderr(&output));
}

#[test]
fn too_few_masters_exits_69_and_missing_command_127() {
    let mut cluster = start_cluster();
    for index in 0..3 {
        cluster[index].kill();
    }
    let output = run(lock(&cluster, &[SHORT, &["r"]].concat(), &["true"]));
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(stderr(&output).contains("too few masters"), "{}", stderr(&output));

    let cluster = start_cluster();
    let output = run(lock(&cluster, &[SHORT, &["r"]].concat(), &["/no/such/command"]));
    assert_eq!(output.status.code(), Some(127), "{}", stderr(&output));
}

#[test]
fn command_is_stopped_before_validity_ends_when_the_lock_is_lost() {
    let cluster = start_cluster();
    let dir = tempfile::tempdir().expect("tempdir");
    let marks = dir.path().join("marks");
    // The command ignores SIGTERM, so it takes SIGKILL to stop it; it records when SIGTERM arrived.
    let script = format!(
        "trap 'date +%s%N >> {marks}; ' TERM; echo started; while true; do sleep 0.05; done",
        marks = marks.display()
    );
    let mut child = lock(
        &cluster,
        &["--ttl", "3s", "--max-ttl", "3s", "--assume-durable", "-v", "lost"],
        &["sh", "-c", &script],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("lock");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("started");
    std::thread::sleep(Duration::from_millis(1_500));

    // The last successful extension happened before this, so the lock's validity ends before now + ttl.
    let paused_at_ns = unix_nanos();
    for index in 0..3 {
        cluster[index].stop();
    }
    let output = child.wait_with_output().expect("lock exits");
    let finished_ns = unix_nanos();
    for index in 0..3 {
        cluster[index].cont();
    }
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("lock `lost` lost"),
        "{}",
        stderr(&output)
    );
    let term_ns: u128 = read_first(&marks).trim().parse().expect("SIGTERM time");
    let validity_bound = paused_at_ns + 3_000_000_000;
    assert!(
        term_ns < validity_bound,
        "SIGTERM came {} ms too late",
        (term_ns - validity_bound) / 1_000_000
    );
    assert!(
        finished_ns < validity_bound + 1_000_000_000,
        "lock returned long after the validity ended"
    );
}

fn unix_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
}

fn read_first(path: &Path) -> String {
    std::fs::read_to_string(path)
        .expect("the command recorded SIGTERM")
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn the_command_dies_with_a_killed_lock_process() {
    let cluster = start_cluster();
    let dir = tempfile::tempdir().expect("dir");
    let pid_file = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let mut args = SHORT.to_vec();
    args.push("killed");
    let mut child = lock(&cluster, &args, &["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("lock");
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file)
            && let Ok(pid) = text.trim().parse::<i32>()
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    // Nothing of ours is left to stop it: the kernel does (parent-death signal).
    let deadline = Instant::now() + Duration::from_secs(5);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "the command outlived the killed lock process"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 16, item 1: two of five masters hung (SIGSTOP) before `lock` starts. It runs the command without
/// waiting for their connections, and says what became of them.
#[test]
fn a_hung_minority_does_not_hold_the_command_up() {
    let cluster = start_cluster();
    cluster[3].stop();
    cluster[4].stop();
    let mut args = SHORT.to_vec();
    args.extend(["-v", "hung-minority"]);
    let output = run(lock(&cluster, &args, &["true"]));
    cluster[3].cont();
    cluster[4].cont();
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{err}");
    let acquire = err
        .lines()
        .skip_while(|line| !line.contains("acquire: "))
        .take(6)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(acquire.contains("3/5 votes"), "{acquire}");
    for url in &cluster.urls()[3..] {
        let line = acquire
            .lines()
            .find(|line| line.contains(url.as_str()))
            .unwrap_or_default();
        // Had `lock` waited for their connect timeout, the reason would say so instead.
        assert!(
            line.contains("unavailable: connecting"),
            "the hung master is reported, not waited for: {acquire}"
        );
    }
}

/// Issue 16, item 2: two masters hang while the command runs. `lock` decides its release at a majority, and
/// the deletes it sends the hung masters are not lost when it exits: they reach them once they resume.
#[test]
fn deletes_to_hung_masters_survive_the_exit_of_lock() {
    let cluster = start_cluster();
    let key = "late-release";
    // A TTL far longer than the test, so that a key found gone was deleted, not expired.
    let args = ["--ttl", "30s", "--max-ttl", "30s", "--assume-durable", "-v", key];
    // By the time the command runs every master has the key, or has its SET queued ahead of the delete.
    let script = format!("kill -STOP {} {}", cluster[3].pid(), cluster[4].pid());
    let output = run(lock(&cluster, &args, &["sh", "-c", &script]));
    let err = stderr(&output);
    cluster[3].cont();
    cluster[4].cont();
    assert_eq!(output.status.code(), Some(0), "{err}");
    let section = |name: &str| -> Vec<&str> {
        err.lines()
            .skip_while(|line| !line.contains(name))
            .take(6)
            .collect()
    };
    let outcome = |lines: &[&str], url: &str| {
        lines
            .iter()
            .find(|line| line.contains(url))
            .copied()
            .unwrap_or("")
            .to_owned()
    };
    let (acquire, release) = (section("acquire: "), section("release: "));
    // `lock` starts once any majority is verified: only when the hung masters were not among the holders can the
    // release be decided without them. Then it must not wait for them.
    let hung = &cluster.urls()[3..];
    if hung.iter().all(|url| !outcome(&acquire, url).contains("granted")) {
        for url in hung {
            let line = outcome(&release, url);
            // Pending: decided without it; unavailable: it was not connected yet, so it never got the key.
            assert!(
                line.contains("pending") || line.contains("unavailable"),
                "decided at a majority: {err}"
            );
        }
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = cluster
            .urls()
            .iter()
            .filter(|url| {
                runtime
                    .block_on(crate::support::redis_server::raw_get(url, key))
                    .is_some()
            })
            .count();
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} master(s) kept the key after `lock` exited: {err}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 14: every run gets a fencing token above the previous run's, from the masters' counters (`lock` keeps
/// no memory between runs), and `-v` prints it.
#[test]
fn each_run_gets_a_higher_fencing_token() {
    let cluster = start_cluster();
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let output = run(lock(
            &cluster,
            &[SHORT, &["-v", "tokens"]].concat(),
            &["sh", "-c", "echo $REDLOCK_FENCING_TOKEN"],
        ));
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(0), "{err}");
        let token: i64 = String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("a token in the environment");
        assert!(err.contains(&format!("fencing token {token}")), "{err}");
        tokens.push(token);
    }
    assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]), "{tokens:?}");
}

/// Issue 24, item 2: right after an installation every master is in its restart quarantine. `lock` says so,
/// how many, and when a majority can vote, instead of only "too few masters".
#[test]
fn a_quarantined_quorum_says_when_a_majority_can_vote() {
    let started = Instant::now();
    let mut cluster = RedisCluster::start(5).expect("masters");
    cluster[4].kill();
    let args = ["--ttl", "1s", "--max-ttl", "60s", "fresh"];
    let output = run(lock(&cluster, &args, &["true"]));
    let elapsed = started.elapsed();
    let all = stderr(&output);
    assert_eq!(output.status.code(), Some(69), "{all}");
    // The engine warns about each quarantined master as it connects; the error is the last line.
    let err = all.trim().lines().last().unwrap_or_default().to_owned();
    // `lock` starts once a majority is connected: the fourth live master may still be connecting.
    let connecting = usize::from(err.contains("3 of 5 masters are still"));
    assert!(
        err.contains(&format!(
            "{} of 5 masters are still in their restart quarantine (started less than max-ttl ago, they may have \
             forgotten locks), {} not connected; 3 of 5 can vote in about ",
            4 - connecting,
            1 + connecting
        )),
        "{all}"
    );
    // The quarantine is 60.602 s from the masters' start (max-ttl plus drift), known to the second; they
    // started within `elapsed` before the reply.
    let seconds: u64 = err
        .split("can vote in about ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("a number of seconds: {err}"));
    let earliest = 61u64.saturating_sub(elapsed.as_secs() + 2);
    assert!(
        (earliest..=61).contains(&seconds),
        "{seconds} s, expected {earliest}..=61 after {elapsed:?}: {err}"
    );
    assert!(
        err.contains(&format!("(`--wait {}s` waits for them)", seconds + 5 - 1))
            || err.contains(&format!("(`--wait {}s` waits for them)", seconds + 5)),
        "a --wait that would do: {err}"
    );

    // Two of five left: even the end of the quarantine does not make a majority, and the message says that.
    cluster[3].kill();
    cluster[2].kill();
    let output = run(lock(&cluster, &args, &["true"]));
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(69), "{err}");
    assert!(
        err.contains("2 of 5 masters are still in their restart quarantine")
            && err.contains("3 not connected; even once it is over only 2 of the 3 needed could vote"),
        "{err}"
    );
    assert!(!err.contains("--wait"), "no wait helps: {err}");
}

/// Credentials from files (a mounted Secret), put into the URLs percent-encoded: the chart's `helm test` hook
/// reads the masters' password this way.
#[test]
fn the_password_can_come_from_a_file() {
    let password = "p@ss:w/rd %1";
    let cluster = RedisCluster::start_with(3, |_| crate::support::redis_server::Options {
        password: Some(password.to_owned()),
        ..Default::default()
    })
    .expect("masters");
    std::thread::sleep(Duration::from_millis(3_100));
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("password");
    std::fs::write(&file, format!("{password}\n")).expect("password file");
    let plain: Vec<String> = cluster
        .servers()
        .iter()
        .map(|server| format!("redis://127.0.0.1:{}", server.port()))
        .collect();
    let with_file = |urls: &[String]| {
        let mut cmd = Command::new(BIN);
        cmd.arg("lock")
            .env("REDLOCK_REDIS", urls.join(","))
            .env_remove("RUST_LOG")
            .args(SHORT)
            .arg("--redis-password-file")
            .arg(&file)
            .args(["from-file", "--", "true"]);
        cmd
    };
    let output = run(with_file(&plain));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

    // A password in a URL as well is ambiguous: refused, without showing either.
    let in_url: Vec<String> = plain
        .iter()
        .map(|url| url.replace("redis://", "redis://:hunter2@"))
        .collect();
    let output = run(with_file(&in_url));
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(64), "{err}");
    assert!(err.contains("not both") && !err.contains("hunter2"), "{err}");
    // Without the file, the masters refuse.
    let output = run(lock(
        &cluster,
        &[SHORT, &["--redis", &plain.join(","), "no-password"]].concat(),
        &["true"],
    ));
    assert_ne!(output.status.code(), Some(0), "{}", stderr(&output));
}
