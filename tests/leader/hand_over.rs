//! Hand-overs (issues 29 and 39): a leader that reports its work stopped hands over before its validity ends,
//! in either order of a deletion's SIGTERM and move; reports go only to the pinned server; and a given-up key
//! waits for the time status records, across a change of replica.

use super::elect::{ReportingLeader, spawn_elect};
use super::*;
use crate::support::report_door::{Impostor, ReportDoor};

/// The lock's status.handOverUrl with its certificate pin, and the key waiting with `token` (its holder and
/// release time), once status records it as given up.
async fn given_up(env: &Env, token: i64) -> ((String, String), String, k8s_openapi::jiff::Timestamp) {
    let lock = lock_where(env, "web", "the key given up recorded", |lock| {
        lock.status
            .as_ref()
            .is_some_and(|status| status.releasing.iter().any(|key| key.fencing_token == token))
    })
    .await;
    let status = lock.status.expect("status");
    let key = status
        .releasing
        .iter()
        .find(|key| key.fencing_token == token)
        .expect("the key");
    (
        (
            status
                .hand_over_url
                .clone()
                .expect("status shows where to report"),
            status
                .hand_over_certificate_sha256
                .clone()
                .expect("status pins the certificate there"),
        ),
        key.holder.clone(),
        key.release_at.0,
    )
}

/// web-1 leads, before `shown` (the validity shown to web-0) has ended, on web-0's one report taken.
async fn handed_over_on_the_report(env: &Env, running: &Running, shown: k8s_openapi::jiff::Timestamp) {
    wait_for_leader(env, "web-1").await;
    assert!(
        k8s_openapi::jiff::Timestamp::now() < shown,
        "the hand-over waited for the validity shown"
    );
    assert_eq!(reports_taken(running).await, 1.0, "the operator took one report");
}

/// Issue 29: a holder that reports its work stopped hands over at once, not when the validity shown to it ends;
/// a report is taken only from the holder's own pod, for its own given-up grant, with a token for our audience
/// (forged, stale and early reports are refused, and change nothing); `elect` reports by itself after a move
/// and after SIGTERM (a rolling update). At a 60 s TTL, a hand-over that waited for the validity would take a
/// minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_reports_its_work_stopped_hands_over_before_its_validity_ends() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let (quorum, running, shutdown) = setup_long_ttl(&masters, &env, 31).await;
    ready_pods(&env, &["web-0", "web-1", "web-2"]).await;
    web_lock(&env, &quorum, "60s", None).await;
    wait_for_leader(&env, "web-0").await;

    let dir = tempfile::tempdir().expect("dir");
    let mut tokens = BTreeMap::new();
    for pod in ["web-0", "web-1", "web-2"] {
        let file = dir.path().join(format!("{pod}.token"));
        let token = pod_token(&env, pod, "redlock-operator").await;
        std::fs::write(&file, &token).expect("token file");
        tokens.insert(pod, token);
    }
    // One log for every command, appended in the order things happen.
    let log = dir.path().join("log");
    let script = "echo \"start $POD $REDLOCK_FENCING_TOKEN\" >> \"$OUT\"; trap 'echo \"stop $POD\" >> \"$OUT\"; exit 0' TERM; while true; do sleep 0.05; done";
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    // web-0's elect has no token: it cannot report, and its key waits.
    let mut web0 = spawn_elect(&env, "web-0", &dir.path().join("missing"), script, &log);
    eventually("web-0's command to start", || async {
        (read() == "start web-0 1\n").then_some(())
    })
    .await;

    // 1. A move with no report: the key waits for the validity shown to web-0.
    let shown = valid_until(&env, "web-0").await;
    set_ready(&env, "web-0", false).await;
    eventually("web-0's command to stop", || async {
        read().ends_with("stop web-0\n").then_some(())
    })
    .await;
    let ((url, pin), holder, release_at) = given_up(&env, 1).await;
    assert_eq!(holder, "web-0");
    assert!(
        release_at >= shown,
        "released before the validity shown ends: {release_at} < {shown}"
    );
    // Forged, stale and early reports are refused and release nothing.
    let report = |token: i64| serde_json::json!({ "lock": "web", "permit": 0, "fencingToken": token });
    let api_token = pod_token(&env, "web-0", "https://kubernetes.default.svc.cluster.local").await;
    for (bearer, body, code, reason, what) in [
        (None, report(1), 401, "Unauthorized", "no token"),
        (
            Some(api_token.as_str()),
            report(1),
            401,
            "Unauthorized",
            "a token for another audience",
        ),
        (
            Some(tokens["web-1"].as_str()),
            report(1),
            403,
            "NotTheHolder",
            "another pod reporting for web-0",
        ),
        (
            Some(tokens["web-0"].as_str()),
            report(2),
            409,
            "NotGivenUp",
            "a token never given up",
        ),
        (
            Some(tokens["web-0"].as_str()),
            serde_json::json!({ "lock": "web", "permit": 1, "fencingToken": 1 }),
            409,
            "NotGivenUp",
            "another permit",
        ),
        (
            Some(tokens["web-0"].as_str()),
            serde_json::json!({ "lock": "nope", "permit": 0, "fencingToken": 1 }),
            404,
            "NotFound",
            "a lock that does not exist",
        ),
    ] {
        assert_eq!(
            send_stopped_report(&url, &pin, bearer, body).await,
            (code, reason.to_owned()),
            "{what}"
        );
    }
    assert!(
        labelled(&env).await.is_empty(),
        "a refused report released the key"
    );
    // web-0's own report, as its elect would send it: taken, and web-1 leads long before the validity ends.
    assert_eq!(
        send_stopped_report(&url, &pin, Some(&tokens["web-0"]), report(1)).await,
        (200, "Taken".to_owned())
    );
    wait_for_leader(&env, "web-1").await;
    assert!(
        k8s_openapi::jiff::Timestamp::now() < shown,
        "the hand-over waited for the validity"
    );
    let _ = web0.kill().await;

    // 2. A move where elect reports by itself: web-1 becomes unready, and web-2 leads before web-1's validity
    // ends, after web-1's command stopped.
    let _ = std::fs::remove_file(&log);
    let mut web1 = spawn_elect(&env, "web-1", &dir.path().join("web-1.token"), script, &log);
    let mut web2 = spawn_elect(&env, "web-2", &dir.path().join("web-2.token"), script, &log);
    eventually("web-1's command to start", || async {
        read().starts_with("start web-1 ").then_some(())
    })
    .await;
    let shown = valid_until(&env, "web-1").await;
    set_ready(&env, "web-1", false).await;
    wait_for_leader(&env, "web-2").await;
    assert!(
        k8s_openapi::jiff::Timestamp::now() < shown,
        "web-1's elect did not report"
    );
    eventually("web-2's command to start", || async {
        read()
            .lines()
            .any(|line| line.starts_with("start web-2 "))
            .then_some(())
    })
    .await;
    let lines: Vec<String> = read().lines().map(str::to_owned).collect();
    let stopped = lines.iter().position(|line| line == "stop web-1");
    let started = lines.iter().position(|line| line.starts_with("start web-2 "));
    assert!(
        stopped.is_some() && stopped < started,
        "web-2 started before web-1 stopped: {lines:?}"
    );

    // 3. A rolling update: web-1 ready again, web-2's pod deleted; the test plays the kubelet and sends SIGTERM
    // to its elect, which stops the command, reports once the key is recorded as given up, and exits.
    set_ready(&env, "web-1", true).await;
    let shown = valid_until(&env, "web-2").await;
    pods(&env)
        .delete("web-2", &DeleteParams::default())
        .await
        .expect("delete web-2");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(web2.id().expect("pid")).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    wait_for_leader(&env, "web-1").await;
    assert!(
        k8s_openapi::jiff::Timestamp::now() < shown,
        "web-2's elect did not report on SIGTERM"
    );
    let status = tokio::time::timeout(PATIENCE, web2.wait())
        .await
        .expect("elect exits after reporting")
        .expect("status");
    assert_eq!(status.code(), Some(0), "the command's own status after SIGTERM");
    let _ = web1.kill().await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// The defect seen on a real node with the chart: the first deletion of a leader pod was not reported (the
/// hand-over still took 0.3 s, by the pod's disappearance, while the Event named the end of the validity).
/// `elect` tried to report only until the validity shown at its grant had ended, never a later one: a leader
/// deleted after leading for a TTL (extended all along) gave up at once, silently, when status had not recorded
/// its key as given up yet at its command's exit, as when the kubelet's SIGTERM comes first (on k8s-node it did
/// in most deletions; a second leader, deleted within a TTL of its grant, reported). Here: a fresh lock, a fresh
/// `elect`, its first grant held past the validity shown when it started; then in the kubelet's order, each step
/// awaited: SIGTERM, the command stopped, the pod deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_deleted_after_its_grants_first_validity_still_reports_on_sigterm() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let (quorum, running, shutdown) = setup_long_ttl(&masters, &env, 32).await;
    let mut web0 = ReportingLeader::start(&env, &quorum, "10s").await;
    let first_shown = web0.first_shown();

    // Lead past the validity shown at the grant: the operator extends the lock meanwhile.
    let left = first_shown.duration_since(k8s_openapi::jiff::Timestamp::now());
    tokio::time::sleep(Duration::try_from(left).unwrap_or_default() + Duration::from_millis(200)).await;
    assert!(k8s_openapi::jiff::Timestamp::now() > first_shown);
    assert_eq!(
        labelled(&env).await,
        ["web-0"],
        "web-0 still leads its first grant"
    );

    // The kubelet's SIGTERM: the command stops while status still shows the grant.
    web0.terminate();
    web0.command_stopped("web-0's command to stop").await;
    web0.wait_for_log(
        "it is reported once status records the key as given up",
        "after SIGTERM before status recorded its key as given up: it reported nothing",
    )
    .await;
    let shown = valid_until(&env, "web-0").await;
    assert!(shown > first_shown, "status shows the extensions: {shown}");

    // The deletion makes the operator record the key as given up (the pod is terminating, not gone).
    pods(&env)
        .delete("web-0", &DeleteParams::default())
        .await
        .expect("delete web-0");
    web0.exits_having_reported().await;
    handed_over_on_the_report(&env, &running, shown).await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Issue 39: a holder sends its report, and its token, only to the server whose certificate status pins. Here
/// status names another server (a TLS server with a key of its own, behind a door that counts connections) beside
/// the operator's pin: web-0's `elect` connects to ask how long its grant stays valid, completes no handshake,
/// says why, sends nothing, and never starts its command (#48: no answer, no start; never the wall clock instead);
/// the key waits for the validity shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_sends_nothing_to_a_server_with_another_certificate() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let impostor = Impostor::start().await;
    let quorum = env.unique("q");
    create_long_ttl_quorum(&masters, &env, &quorum).await;
    let (running, shutdown) = operator_reporting_to(&env, &installation_secret(34), &impostor.url()).await;
    quorum_available(&env, &quorum).await;
    let mut web0 = ReportingLeader::spawn(&env, &quorum, "10s", 0).await;
    let shown = valid_until(&env, "web-0").await;
    web0.wait_for_log(
        "shows another certificate than the one status pins: nothing was sent to it",
        "without having tried the server status names",
    )
    .await;

    set_ready(&env, "web-0", false).await;
    wait_for_leader(&env, "web-1").await;
    assert!(
        k8s_openapi::jiff::Timestamp::now() >= shown,
        "handed over before the validity shown to web-0 ended ({shown})"
    );
    assert_eq!(web0.said(), "", "the command started without an answer");
    assert!(impostor.connections() > 0, "elect never connected");
    assert_eq!(
        impostor.requests(),
        0,
        "a request reached the server with another certificate"
    );
    assert_eq!(reports_taken(&running).await, 0.0, "the operator took a report");
    let _ = web0.elect.kill().await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// The other order of a deletion on a real node: status stops showing the leader (the operator saw the pod
/// terminating) before the kubelet's SIGTERM reaches `elect`. `elect` stops its command on the move and reports in
/// the background; the SIGTERM must not cut that report short (it did: `elect` exited at once, and the key waited
/// for the pod to go). The report is held at a door until `elect` has taken the SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_move_came_before_sigterm_finishes_its_report() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let door = ReportDoor::start().await;
    let quorum = env.unique("q");
    create_long_ttl_quorum(&masters, &env, &quorum).await;
    let (running, shutdown) = operator_reporting_to(&env, &installation_secret(33), &door.url()).await;
    quorum_available(&env, &quorum).await;
    // Open while web-0's elect asks how long its grant stays valid; held from then on.
    door.open_to(running.reports_addr.expect("the reports port is open"));
    let mut web0 = ReportingLeader::start(&env, &quorum, "20s").await;
    door.hold();
    let asked = door.accepted();
    let shown = valid_until(&env, "web-0").await;

    // The deletion: status stops showing web-0, whose elect stops the command and sends its report (held).
    pods(&env)
        .delete("web-0", &DeleteParams::default())
        .await
        .expect("delete web-0");
    web0.command_stopped("web-0's command to stop on the move").await;
    eventually("web-0's report to reach the door", || async {
        (door.accepted() > asked).then_some(())
    })
    .await;
    // Then the kubelet's SIGTERM, while the report is in flight.
    web0.terminate();
    web0.wait_for_log(
        "finishing the report",
        "on SIGTERM with its report in flight: the report was cut short",
    )
    .await;
    door.open_to(running.reports_addr.expect("the reports port is open"));
    web0.exits_having_reported().await;
    handed_over_on_the_report(&env, &running, shown).await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Issue 29: a hand-over's wait survives a change of replica. A leader that becomes unready gives its key up, to
/// be released when the validity shown to it ends, and status records when (`status.releasing`). The replica
/// stops before then and the key is pinned on the masters for ten minutes, so that only a release frees it: the
/// next replica releases it at the recorded time and elects the next pod. (Without the record it left the key
/// to expire.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_releases_a_given_up_key_when_status_says_not_when_it_expires() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let (quorum, running, shutdown) = setup(&masters, &env, 28).await;
    ready_pods(&env, &["web-0", "web-1"]).await;
    web_lock(&env, &quorum, "3s", None).await;
    wait_for_leader(&env, "web-0").await;
    set_ready(&env, "web-0", false).await;
    let given_up = lock_where(&env, "web", "the given-up key recorded in status", |lock| {
        lock.status
            .as_ref()
            .is_some_and(|status| !status.releasing.is_empty())
    })
    .await;
    stop(running, shutdown).await;
    let recorded = given_up.status.map(|status| status.releasing).unwrap_or_default();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!((recorded[0].permit, recorded[0].holder.as_str()), (0, "web-0"));
    let key = format!("{}/web", env.namespace);
    for url in masters.urls() {
        let mut conn = redis::Client::open(url.as_str())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        // A key the stopped replica released already (a machine slow enough to pass the recorded time while it
        // stopped) is not re-created: there is then nothing left to wait for.
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(&key)
            .arg(600_000)
            .query_async(&mut conn)
            .await
            .expect("PEXPIRE");
    }

    let (running, shutdown) = operator(&env, &installation_secret(28), None).await;
    wait_for_leader(&env, "web-1").await;
    lock_where(&env, "web", "web-1 holding, nothing left waiting", |lock| {
        lock.status.as_ref().is_some_and(|status| {
            status.holder.as_deref() == Some("web-1")
                && phase(lock) == Some(LockPhase::Held)
                && status.releasing.is_empty()
        })
    })
    .await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// A Pod object gone is no proof that its containers stopped: `kubectl delete --force --grace-period=0` removes it
/// while they run on (a node cut off never stops them). So a leader force-deleted while it runs keeps its key
/// until the validity it was shown has ended: the next leader is labelled no sooner. One whose kubelet reported it
/// finished before the object went (as the kubelet does on every deletion it carries out) has stopped: its key
/// goes at once, which the `Released` note says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_force_deleted_while_it_runs_keeps_its_key_until_its_validity_ends() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let (quorum, running, shutdown) = setup(&masters, &env, 36).await;
    ready_pods(&env, &["web-0", "web-1", "web-2"]).await;
    web_lock(&env, &quorum, "3s", None).await;
    wait_for_leader(&env, "web-0").await;

    // Force-deleted while Running: web-1 leads only once the validity shown to web-0 has ended.
    let shown = valid_until(&env, "web-0").await;
    pods(&env)
        .delete("web-0", &DeleteParams::default().grace_period(0))
        .await
        .expect("force delete");
    wait_for_leader(&env, "web-1").await;
    let moved_at = k8s_openapi::jiff::Timestamp::now();
    assert!(
        moved_at >= shown,
        "web-1 led at {moved_at}, before the validity {shown} shown to the force-deleted web-0 ended"
    );

    // Reported finished by its kubelet, then deleted: its key goes at once, whatever the validity shown.
    let finished = serde_json::json!({ "status": { "phase": "Failed" } });
    pods(&env)
        .patch_status("web-1", &PatchParams::default(), &Patch::Merge(&finished))
        .await
        .expect("pod status");
    pods(&env)
        .delete("web-1", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    wait_for_leader(&env, "web-2").await;
    let notes = eventually("the Released note of web-1's key", || async {
        let list = env.events().list(&ListParams::default()).await.ok()?;
        let notes: Vec<String> = list
            .items
            .into_iter()
            .filter(|event| {
                event.reason.as_deref() == Some("Released")
                    && event
                        .note
                        .as_deref()
                        .is_some_and(|note| note.contains("released for web-1"))
            })
            .filter_map(|event| event.note)
            .collect();
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    assert!(
        notes.iter().any(|note| note.contains("released now")),
        "web-1 was reported finished: its key goes at once: {notes:?}"
    );
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}
