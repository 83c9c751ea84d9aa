//! The `elect` helper as a pod's process: it runs its command only while its pod leads, with the lock's token,
//! stops it before the validity ends on its own clock, and reports when the work stopped.

use super::*;

/// `elect` for `pod` running `script` (with `$POD` set), reporting with the token in `token_file`.
pub(super) fn spawn_elect(
    env: &Env,
    pod: &str,
    token_file: &std::path::Path,
    script: &str,
    out: &std::path::Path,
) -> tokio::process::Child {
    spawn_elect_logging(env, pod, token_file, script, out, std::process::Stdio::null(), 0)
}

/// [`spawn_elect`] with elect's own log going to `stderr`, and its wall clock shifted by `clock_offset_ms` (the
/// test builds' `REDLOCK_TEST_WALL_CLOCK_OFFSET_MS`).
fn spawn_elect_logging(
    env: &Env,
    pod: &str,
    token_file: &std::path::Path,
    script: &str,
    out: &std::path::Path,
    stderr: std::process::Stdio,
    clock_offset_ms: i64,
) -> tokio::process::Child {
    let offset = clock_offset_ms.to_string();
    spawn_helper_logging(
        env,
        &["elect", "--lock", "web", "--pod", pod],
        script,
        &[
            ("REDLOCK_REPORT_TOKEN_FILE", token_file.as_os_str()),
            ("OUT", out.as_os_str()),
            ("POD", pod.as_ref()),
            ("REDLOCK_TEST_WALL_CLOCK_OFFSET_MS", offset.as_ref()),
        ],
        stderr,
    )
}

/// web-0 leading a fresh lock under a fresh `elect` that reports with its pod's token: its command writes its
/// lines to `out` (its token and the validity shown when it started, then `stop`), elect its own log to `log`.
pub(super) struct ReportingLeader {
    pub(super) elect: tokio::process::Child,
    out: std::path::PathBuf,
    log: std::path::PathBuf,
    /// The command's first line: `start <token> <REDLOCK_VALID_UNTIL>`.
    started: String,
    _dir: tempfile::TempDir,
}

impl ReportingLeader {
    /// Pods web-0 and web-1, the lock `web` of `ttl` led by web-0, and web-0's elect; returns once its command
    /// has started.
    pub(super) async fn start(env: &Env, quorum: &str, ttl: &str) -> Self {
        Self::spawn(env, quorum, ttl, 0).await.started().await
    }

    /// [`Self::start`] without waiting for the command, elect's wall clock shifted by `clock_offset_ms`.
    pub(super) async fn spawn(env: &Env, quorum: &str, ttl: &str, clock_offset_ms: i64) -> Self {
        ready_pods(env, &["web-0", "web-1"]).await;
        web_lock(env, quorum, ttl, None).await;
        wait_for_leader(env, "web-0").await;
        Self::spawn_on_web_0(env, clock_offset_ms).await
    }

    /// web-0's elect, on a lock and pods already there (web-0 leading), once its command has started.
    pub(super) async fn start_on_web_0(env: &Env) -> Self {
        Self::spawn_on_web_0(env, 0).await.started().await
    }

    async fn spawn_on_web_0(env: &Env, clock_offset_ms: i64) -> Self {
        let dir = tempfile::tempdir().expect("dir");
        let token_file = dir.path().join("web-0.token");
        let token = pod_token(env, "web-0", "redlock-operator").await;
        std::fs::write(&token_file, token).expect("token file");
        let (out, log) = (dir.path().join("out"), dir.path().join("elect.log"));
        let script = "echo \"start $REDLOCK_FENCING_TOKEN $REDLOCK_VALID_UNTIL\" >> \"$OUT\"; trap 'echo stop >> \"$OUT\"; exit 0' TERM; while true; do sleep 0.05; done";
        let stderr = std::fs::File::create(&log).expect("elect's log");
        let elect = spawn_elect_logging(
            env,
            "web-0",
            &token_file,
            script,
            &out,
            stderr.into(),
            clock_offset_ms,
        );
        Self {
            elect,
            out,
            log,
            started: String::new(),
            _dir: dir,
        }
    }

    /// Once the command has started under the first grant.
    async fn started(mut self) -> Self {
        let out = self.out.clone();
        self.started = eventually("web-0's command to start", || async {
            let said = std::fs::read_to_string(&out).unwrap_or_default();
            said.lines().next().map(str::to_owned)
        })
        .await;
        assert!(
            self.started.starts_with("start 1 "),
            "the first grant: {}",
            self.started
        );
        self
    }

    /// The command's lines so far.
    pub(super) fn said(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// The validity shown to the command when it started: its grant's.
    pub(super) fn first_shown(&self) -> k8s_openapi::jiff::Timestamp {
        self.started
            .split(' ')
            .nth(2)
            .and_then(|text| text.parse().ok())
            .expect("the command got REDLOCK_VALID_UNTIL")
    }

    /// SIGTERM to elect, as the kubelet stops a pod's container.
    pub(super) fn terminate(&self) {
        let pid = i32::try_from(self.elect.id().expect("pid")).expect("pid");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM)
            .expect("SIGTERM");
    }

    pub(super) async fn command_stopped(&self, why: &str) {
        eventually(why, || async {
            let said = std::fs::read_to_string(&self.out).unwrap_or_default();
            said.ends_with("stop\n").then_some(())
        })
        .await;
    }

    /// Waits until elect logs `wanted`; fails at once, saying `why`, if it exits first.
    pub(super) async fn wait_for_log(&mut self, wanted: &str, why: &str) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let said = std::fs::read_to_string(&self.log).unwrap_or_default();
            if said.contains(wanted) {
                return;
            }
            if let Ok(Some(status)) = self.elect.try_wait() {
                let said = std::fs::read_to_string(&self.log).unwrap_or_default();
                assert!(
                    said.contains(wanted),
                    "elect exited ({status}) {why}; its log:\n{said}"
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for elect to log `{wanted}`"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for elect to exit after its report was taken, with exit status 0.
    pub(super) async fn exits_having_reported(mut self) {
        let status = tokio::time::timeout(PATIENCE, self.elect.wait())
            .await
            .expect("elect exits once its report is taken")
            .expect("status");
        let said = std::fs::read_to_string(&self.log).unwrap_or_default();
        assert!(
            said.contains("reported the work under fencing token 1 stopped"),
            "elect did not report: {said}"
        );
        assert_eq!(status.code(), Some(0), "after SIGTERM");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_runs_the_command_only_on_the_leader_with_its_token() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let (quorum, running, shutdown) = setup(&masters, &env, 26).await;
    ready_pods(&env, &["web-0", "web-1"]).await;
    web_lock(&env, &quorum, "3s", None).await;
    wait_for_leader(&env, "web-0").await;

    let dir = tempfile::tempdir().expect("dir");
    let script = "echo \"start $REDLOCK_FENCING_TOKEN\" >> \"$OUT\"; trap 'echo stop >> \"$OUT\"; exit 0' TERM; while true; do sleep 0.05; done";
    let mut helpers = Vec::new();
    for pod in ["web-0", "web-1"] {
        let out = dir.path().join(pod);
        let child = spawn_elect(&env, pod, &dir.path().join("no-token"), script, &out);
        helpers.push((child, out));
    }
    let read = |path: &std::path::Path| std::fs::read_to_string(path).unwrap_or_default();
    eventually("the leader's command to start", || async {
        (read(&helpers[0].1) == "start 1\n").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(read(&helpers[1].1), "", "a follower ran the command");

    set_ready(&env, "web-0", false).await;
    eventually("web-0's command to stop and web-1's to start", || async {
        (read(&helpers[0].1) == "start 1\nstop\n" && read(&helpers[1].1) == "start 2\n").then_some(())
    })
    .await;
    // SIGTERM, as Kubernetes stops a pod: the helper stops its command and exits.
    for (mut child, out) in helpers {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().expect("pid")).expect("pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let status = tokio::time::timeout(PATIENCE, child.wait())
            .await
            .expect("elect exits")
            .expect("status");
        assert!(status.code().is_some(), "elect exited by itself: {status}");
        let _ = out;
    }
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Issue 48 (item 1): a leader whose wall clock is 30 s behind the operator's, thirty times its fence margin, still
/// stops its work before the validity ends: it counts the validity the active replica tells it from the moment it
/// asked, on its own monotonic clock, and never compares its wall clock with status's `validUntil`. The operator
/// goes (no status write, no answer, no fence), and the command stops on the stop time of the last answer, before
/// the validity status showed. A new replica resumes the lock, the command starts again on its answers, and a move
/// hands the lock over on elect's report before the validity shown ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_wall_clock_is_behind_stops_before_the_validity_ends_and_hands_over() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let (quorum, running, shutdown) = setup_long_ttl(&masters, &env, 35).await;
    let mut web0 = ReportingLeader::spawn(&env, &quorum, "8s", -30_000)
        .await
        .started()
        .await;

    stop(running, shutdown).await;
    let shown = lock_where(&env, "web", "held", |lock| phase(lock) == Some(LockPhase::Held))
        .await
        .status
        .and_then(|status| status.valid_until)
        .expect("status shows the validity")
        .0;
    web0.command_stopped("web-0's command to stop on its own clock")
        .await;
    let stopped_by = k8s_openapi::jiff::Timestamp::now();
    assert!(
        stopped_by < shown,
        "the command ran until {stopped_by}, past the validity status showed ({shown})"
    );

    let (running, shutdown) = operator(&env, &installation_secret(35), None).await;
    eventually("web-0's command to start again under the new replica", || async {
        (web0.said().matches("start ").count() == 2).then_some(())
    })
    .await;
    wait_for_leader(&env, "web-0").await;
    let shown = valid_until(&env, "web-0").await;
    set_ready(&env, "web-0", false).await;
    web0.wait_for_log("reported the work under fencing token", "after the move")
        .await;
    wait_for_leader(&env, "web-1").await;
    assert!(
        k8s_openapi::jiff::Timestamp::now() < shown,
        "the hand-over waited for the validity shown"
    );
    // The report of the stop when the operator went may be taken too, once the new replica records the key.
    assert!(
        reports_taken(&running).await >= 1.0,
        "the operator took no report"
    );
    let _ = web0.elect.kill().await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}
