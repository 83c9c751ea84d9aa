//! `lock --permits N`: at most N commands at once on one name, each with its own permit and token (issue 23).

use super::*;

/// Issue 23: `--permits N` runs at most N commands at once on one name; each gets its own permit and token.
#[test]
fn at_most_n_commands_run_at_once_with_permits() {
    let cluster = start_cluster();
    let dir = tempfile::tempdir().expect("tempdir");
    let release = dir.path().join("release");
    let args = [SHORT, &["--permits", "2", "migrations"]].concat();
    let holder = |name: &str| {
        let out = dir.path().join(name);
        let script = format!(
            "echo \"$REDLOCK_PERMIT $REDLOCK_FENCING_TOKEN\" > {out}.tmp && mv {out}.tmp {out}; \
             while [ ! -e {release} ]; do sleep 0.05; done",
            out = out.display(),
            release = release.display()
        );
        // Started together, two contenders can split the masters between two permits and both fail an
        // attempt (as two contenders for one lock can): they retry.
        let waiting = [&args[..], &["--wait", "20s"]].concat();
        let mut cmd = lock(&cluster, &waiting, &["sh", "-c", &script]);
        cmd.stdin(Stdio::null());
        (KillOnDrop(cmd.spawn().expect("spawn lock")), out)
    };
    let (mut first, first_out) = holder("first");
    let (mut second, second_out) = holder("second");
    let permits: Vec<(u32, i64)> = [&first_out, &second_out]
        .iter()
        .map(|path| {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !path.exists() {
                assert!(Instant::now() < deadline, "{} never got a permit", path.display());
                std::thread::sleep(Duration::from_millis(20));
            }
            let line = read_first(path);
            let mut fields = line.split_whitespace();
            let permit = fields.next().and_then(|f| f.parse().ok()).expect("permit");
            let token = fields.next().and_then(|f| f.parse().ok()).expect("token");
            (permit, token)
        })
        .collect();
    let mut numbers: Vec<u32> = permits.iter().map(|(permit, _)| *permit).collect();
    numbers.sort_unstable();
    assert_eq!(numbers, vec![0, 1], "one permit each: {permits:?}");

    // Both permits are taken: a third command does not run.
    let third = run(lock(&cluster, &args, &["true"]));
    assert_eq!(third.status.code(), Some(75), "{}", stderr(&third));

    std::fs::write(&release, b"").expect("release");
    assert_eq!(first.0.wait().expect("first").code(), Some(0));
    assert_eq!(second.0.wait().expect("second").code(), Some(0));
    let output = run(lock(
        &cluster,
        &args,
        &["sh", "-c", "echo \"$REDLOCK_PERMIT $REDLOCK_FENCING_TOKEN\""],
    ));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut fields = stdout.split_whitespace();
    let permit: u32 = fields.next().and_then(|f| f.parse().ok()).expect("permit");
    let token: i64 = fields.next().and_then(|f| f.parse().ok()).expect("token");
    let before = permits
        .iter()
        .find(|(number, _)| *number == permit)
        .map(|(_, token)| *token)
        .expect("a permit used before");
    assert!(
        token > before,
        "permit {permit}'s token rises: {before} then {token}"
    );

    let bad = run(lock(
        &cluster,
        &[SHORT, &["--permits", "0", "x"]].concat(),
        &["true"],
    ));
    assert_eq!(bad.status.code(), Some(64), "{}", stderr(&bad));
}

/// Issue 23, the `lock` command's part of the done-when run: ten commands, started together on one name with
/// `--permits 3`, run at most three at a time, each under a permit of its own with that permit's rising token,
/// while one of the five masters is SIGKILLed once three have started (they hold their permits until then)
/// and restarted empty (its fencing counters gone) once six have. Each command logs its start and end with `O_APPEND` (one write each, so the
/// log's order is the order they happened in), inside its lock's hold: the log is checked whatever the timing.
#[test]
fn ten_commands_through_three_permits_run_three_at_a_time_through_a_master_kill() {
    const PERMITS: usize = 3;
    const COMMANDS: usize = 10;
    let mut cluster = start_cluster();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    std::fs::write(&log, b"").expect("log");
    // The commands hold their permits until the master has been killed: the kill comes mid-run, whatever the
    // timing.
    let killed_file = dir.path().join("killed");
    let script = format!(
        "echo \"start $REDLOCK_PERMIT $REDLOCK_FENCING_TOKEN\" >> {log}; \
         while [ ! -e {killed} ]; do sleep 0.05; done; sleep 0.3; \
         echo \"end $REDLOCK_PERMIT $REDLOCK_FENCING_TOKEN\" >> {log}",
        log = log.display(),
        killed = killed_file.display()
    );
    let args = [SHORT, &["--permits", "3", "--wait", "10m"], &["reports"]].concat();
    let mut commands: Vec<KillOnDrop> = (0..COMMANDS)
        .map(|index| {
            let mut cmd = lock(&cluster, &args, &["sh", "-c", &script]);
            // To a file: a pipe nobody reads while the commands wait could fill and stall them.
            let errors =
                std::fs::File::create(dir.path().join(format!("stderr-{index}"))).expect("stderr file");
            cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(errors);
            KillOnDrop(cmd.spawn().expect("spawn lock"))
        })
        .collect();
    let starts = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|line| line.starts_with("start"))
            .count()
    };
    let mut killed = false;
    let mut restarted = false;
    let mut exited = Vec::new();
    while !restarted {
        for (index, command) in commands.iter_mut().enumerate() {
            if !exited.contains(&index) && command.0.try_wait().expect("lock process").is_some() {
                exited.push(index);
            }
        }
        if exited.len() == COMMANDS {
            break;
        }
        let started = starts();
        if started >= 3 && !killed {
            cluster[0].kill();
            killed = true;
            std::fs::write(&killed_file, b"").expect("killed file");
        }
        if started >= 6 && killed {
            cluster[0].restart().expect("restart the master");
            restarted = true;
        }
        if started >= COMMANDS {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for (index, command) in commands.iter_mut().enumerate() {
        let status = command.0.wait().expect("lock process");
        let errors = std::fs::read_to_string(dir.path().join(format!("stderr-{index}"))).unwrap_or_default();
        assert_eq!(status.code(), Some(0), "a command failed: {errors}");
    }
    assert!(killed, "the master was killed mid-run");

    let text = std::fs::read_to_string(&log).expect("log");
    let mut running: Vec<(u32, i64)> = Vec::new();
    let mut last_token = [0i64; PERMITS];
    let mut most_at_once = 0;
    let mut started = 0;
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [what, permit, token] = fields[..] else {
            panic!("a log line of three fields: {line:?}");
        };
        let permit: u32 = permit.parse().expect("a permit number");
        let token: i64 = token.parse().expect("a token");
        let index = usize::try_from(permit).expect("permit");
        assert!(index < PERMITS, "permit {permit} of {PERMITS}: {text}");
        if what == "start" {
            assert!(
                running.iter().all(|(held, _)| *held != permit),
                "permit {permit} runs two commands at once: {text}"
            );
            assert!(
                token > last_token[index],
                "permit {permit}'s token {token} after {}: {text}",
                last_token[index]
            );
            last_token[index] = token;
            running.push((permit, token));
            started += 1;
            most_at_once = most_at_once.max(running.len());
            assert!(
                running.len() <= PERMITS,
                "more commands than permits at once: {text}"
            );
        } else {
            let before = running.len();
            running.retain(|held| *held != (permit, token));
            assert_eq!(
                running.len() + 1,
                before,
                "an end without its start: {line:?} in {text}"
            );
        }
    }
    assert_eq!(started, COMMANDS, "every command ran: {text}");
    assert!(running.is_empty(), "every command ended: {text}");
    assert!(most_at_once > 1, "the permits ran commands side by side: {text}");
}

/// A command started in the background, killed (with its lock process) if the test ends early.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
