//! Waiting `lock` commands are served in the order they asked, and see their place.

use super::*;

/// Whether a majority of the masters queue exactly `count` waiters for `key`: a waiter has arrived once they do.
/// (Not every master: one the holder's key did not reach grants it to the queue's head, which then leaves that
/// master's queue, at every attempt that fails for want of a majority.)
fn arrived(cluster: &RedisCluster, key: &str, count: usize) -> bool {
    let queued = queued_everywhere(cluster, key);
    queued.iter().filter(|queued| **queued == count).count() > queued.len() / 2
}

/// A `lock` run by `first` that holds `key` until the file `go` exists; returned once its command runs.
fn hold_until(cluster: &RedisCluster, key: &str, go: &Path) -> std::process::Child {
    let mut holder = lock(
        cluster,
        &[SHORT, &["--holder", "first", key]].concat(),
        &[
            "sh",
            "-c",
            &format!(
                "echo started; while [ ! -e '{}' ]; do sleep 0.05; done",
                go.display()
            ),
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .expect("holder");
    let mut line = String::new();
    let stdout = holder.stdout.take().expect("stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("started");
    assert_eq!(line.trim(), "started");
    holder
}

/// How many waiters every master queues for `key`.
fn queued_everywhere(cluster: &RedisCluster, key: &str) -> Vec<usize> {
    let (queue, _) = redlock_operator::redlock::queue_keys(key);
    cluster
        .urls()
        .iter()
        .map(|url| {
            let mut conn = redis::Client::open(url.as_str())
                .and_then(|client| client.get_connection())
                .expect("connect");
            redis::cmd("ZCARD")
                .arg(&queue)
                .query::<usize>(&mut conn)
                .expect("ZCARD")
        })
        .collect()
}

/// Issue 31: `lock --wait` commands get the lock in the order they started, each told on stderr its place in
/// the queue and who holds the lock (nothing with --quiet); a single attempt beside the queue is refused and
/// says why; a waiter killed in the queue holds the others up only until the masters stop keeping it.
#[test]
fn waiting_commands_get_the_lock_in_the_order_they_asked_and_see_their_place() {
    let cluster = start_cluster();
    let dir = tempfile::tempdir().expect("dir");
    let go = dir.path().join("go");
    let order = dir.path().join("order");
    let mut holder = hold_until(&cluster, "fair", &go);

    let waiter = |name: &str, extra: &[&str]| {
        let mut args = [SHORT, &["--wait", "60s", "--holder", name]].concat();
        args.extend(extra);
        args.push("fair");
        lock(
            &cluster,
            &args,
            &["sh", "-c", &format!("echo {name} >> '{}'", order.display())],
        )
        .stderr(Stdio::piped())
        .spawn()
        .expect("waiter")
    };
    // A waiter has arrived once a majority of masters queues it; the next starts then.
    let arrived = |count: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !arrived(&cluster, "fair", count) {
            assert!(
                Instant::now() < deadline,
                "{:?}",
                queued_everywhere(&cluster, "fair")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // A line is written whenever the place or the holder changes: the first attempts may meet masters still
    // connecting, or masters the holder's key has not reached yet (its extensions bring it there).
    let line_with = |child: &mut std::process::Child, expected: &str| {
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
        lines
            .find(|line| {
                line.as_ref().map_or(true, |line| {
                    line.contains(expected) && line.contains("held by first")
                })
            })
            .unwrap_or_else(|| panic!("no line with {expected}, held by first"))
            .expect("stderr")
    };
    let mut waiters = Vec::new();
    for (place, name) in ["w0", "w1", "dead", "w2", "w3"].into_iter().enumerate() {
        let mut child = waiter(name, &[]);
        arrived(place + 1);
        let expected = match place {
            0 => "next in the queue".to_owned(),
            place => format!("place {} in the queue ({place} ahead)", place + 1),
        };
        line_with(&mut child, &expected);
        waiters.push((name, child));
    }
    let quiet = waiter("w4", &["--quiet"]);
    arrived(6);

    // A single attempt does not jump the queue, and says so (and who holds the key, when the masters that
    // answered before it was decided had it: a run's first attempt may go out before it reaches them all).
    let output = run(lock(&cluster, &[SHORT, &["fair"]].concat(), &["true"]));
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("waiters ahead in its fair queue"),
        "{}",
        stderr(&output)
    );

    // One waiter dies in the queue; then the holder lets go.
    let (_, mut dead) = waiters.remove(2);
    dead.kill().expect("kill");
    dead.wait().expect("reaped");
    std::fs::write(&go, "").expect("go");
    assert!(holder.wait().expect("holder").success());
    for (name, mut child) in waiters {
        assert!(child.wait().expect("waiter").success(), "{name}");
    }
    let output = quiet.wait_with_output().expect("quiet waiter");
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stderr(&output), "", "--quiet prints nothing while waiting");
    let served = std::fs::read_to_string(&order).expect("order");
    assert_eq!(
        served.split_whitespace().collect::<Vec<_>>(),
        ["w0", "w1", "w2", "w3", "w4"]
    );
}

/// Issue 31, through the command: waiters keep their order while one master restarts empty (and sits out its
/// quarantine) and another is cut off (SIGSTOP: it answers nobody) — neither stalls the queue nor lets anyone in
/// out of turn.
#[test]
fn waiting_commands_keep_their_order_through_a_master_restart_and_a_partition() {
    let mut cluster = start_cluster();
    let dir = tempfile::tempdir().expect("dir");
    let go = dir.path().join("go");
    let order = dir.path().join("order");
    let mut holder = hold_until(&cluster, "faults", &go);
    let mut waiters = Vec::new();
    for (place, name) in ["w0", "w1", "w2"].into_iter().enumerate() {
        let child = lock(
            &cluster,
            &[SHORT, &["--wait", "60s", "--quiet", "--holder", name, "faults"]].concat(),
            &["sh", "-c", &format!("echo {name} >> '{}'", order.display())],
        )
        .spawn()
        .expect("waiter");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !arrived(&cluster, "faults", place + 1) {
            assert!(
                Instant::now() < deadline,
                "{:?}",
                queued_everywhere(&cluster, "faults")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        waiters.push((name, child));
    }
    // One master forgets everything; another stops answering anyone.
    cluster[0].restart().expect("restart");
    cluster[1].stop();
    std::fs::write(&go, "").expect("go");
    assert!(holder.wait().expect("holder").success());
    for (name, mut child) in waiters {
        assert!(child.wait().expect("waiter").success(), "{name}");
    }
    cluster[1].cont();
    let served = std::fs::read_to_string(&order).expect("order");
    assert_eq!(served.split_whitespace().collect::<Vec<_>>(), ["w0", "w1", "w2"]);
}
