//! Job semaphores (spec.permits above 1): at most `permits` Jobs at once, each with its permit's token, and
//! `permits` lowered under running Jobs.

use super::*;

/// The operator, and the `batch` Job semaphore of `permits` with `ttl` on a new quorum of `masters` whose `maxTtl`
/// is `max_ttl`.
pub(super) async fn start_semaphore(
    (masters, max_ttl): (&RedisCluster, &str),
    env: &Env,
    seed: u8,
    ttl: &str,
    permits: usize,
) -> (String, Running, CancellationToken) {
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), max_ttl).await;
    let (running, shutdown) = operator(env, &installation_secret(seed), None).await;
    quorum_available(env, &quorum).await;
    env.create_lock_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
        "metadata": { "name": "batch" },
        "spec": { "quorum": quorum, "ttl": ttl, "permits": permits, "holder": { "jobs": {} } }
    }))
    .await;
    (quorum, running, shutdown)
}

/// A Job of a semaphore's queue: its name, whether it finished, whether it may run, and the grant its pod
/// template shows (permit, token).
type SemaphoreJob = (String, bool, bool, Option<(u32, i64)>);

/// Per Job of a semaphore's queue, what [`SemaphoreJob`] shows.
pub(super) async fn semaphore_grants(env: &Env) -> Vec<SemaphoreJob> {
    let mut grants = Vec::new();
    for job in jobs(env).list(&ListParams::default()).await.expect("jobs").items {
        let runs = !job.spec.as_ref().and_then(|spec| spec.suspend).unwrap_or(false);
        let annotations = job
            .spec
            .as_ref()
            .and_then(|spec| spec.template.metadata.as_ref())
            .and_then(|meta| meta.annotations.clone())
            .unwrap_or_default();
        let grant = match (
            annotations.get("redlock.io/permit"),
            annotations.get("redlock.io/fencing-token"),
        ) {
            (Some(permit), Some(token)) => Some((
                permit.parse().expect("a permit number"),
                token.parse().expect("a token"),
            )),
            _ => None,
        };
        grants.push((job.name_any(), job_finished(&job), runs, grant));
    }
    grants
}

/// What a Job semaphore exists for, checked on the Jobs and pods themselves: at most `permits` Jobs may run at
/// once, the pods that run (or are still stopping) are of at most `permits` grants, and never of two grants of
/// one permit.
pub(super) async fn assert_at_most_permits_running(env: &Env, permits: usize) {
    let running = running_jobs(env).await;
    assert!(
        running.len() <= permits,
        "more Jobs than permits run: {running:?}"
    );
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let mut grants = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    for pod in pods.list(&ListParams::default()).await.expect("pods").items {
        let phase = pod.status.as_ref().and_then(|status| status.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let annotations = pod.annotations();
        if let Some(token) = annotations.get("redlock.io/fencing-token") {
            let permit = annotations.get("redlock.io/permit").cloned().unwrap_or_default();
            grants.entry(permit).or_default().insert(token.clone());
        }
    }
    assert!(
        grants.len() <= permits,
        "pods of more permits than there are: {grants:?}"
    );
    assert!(
        grants.values().all(|tokens| tokens.len() == 1),
        "pods of two grants of one permit at once: {grants:?}"
    );
}

/// Ten short Jobs through a semaphore of three; one master is SIGKILLed once four were granted and restarted
/// empty (its fencing counters gone) once six were: what is asserted holds whenever that happens. Each Job runs
/// 5 s, long enough for the next permits' grants to come while it runs, in the realistic mode on a loaded machine
/// too (with 2 s, one full run saw the grants come one Job apart and no two Jobs side by side).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_semaphore_runs_its_queue_at_most_permits_at_a_time_each_with_its_permits_token() {
    const PERMITS: usize = 3;
    const JOBS: usize = 10;
    let mut masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    for index in 0..JOBS {
        create_job(&env, &format!("job-{index:02}"), None, true, 0, Work::Seconds(5)).await;
    }
    let (quorum, running, shutdown) = start_semaphore((&masters, "6s"), &env, 41, "3s", PERMITS).await;
    // Every grant seen, in the order seen: (permit, token) per Job.
    let mut granted: Vec<(String, u32, i64)> = Vec::new();
    let mut most_at_once = 0;
    let mut restarted = false;
    // Polled rather than waited for with `eventually`: every look also records what it saw.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        assert_at_most_permits_running(&env, PERMITS).await;
        let grants = semaphore_grants(&env).await;
        let runs = grants.iter().filter(|(_, done, runs, _)| *runs && !done).count();
        most_at_once = most_at_once.max(runs);
        for (job, _, _, grant) in &grants {
            if let Some((permit, token)) = grant
                && !granted.iter().any(|(seen, _, _)| seen == job)
            {
                granted.push((job.clone(), *permit, *token));
            }
        }
        if granted.len() >= 4 && masters[0].is_running() && !restarted {
            masters[0].kill();
        }
        if granted.len() >= 6 && !restarted {
            masters[0].restart().expect("restart the master");
            restarted = true;
        }
        if grants.len() == JOBS && grants.iter().all(|(_, done, _, _)| *done) {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            let lock = env.locks().get("batch").await.expect("lock");
            panic!(
                "timed out waiting for the Jobs to complete: {grants:?}; the lock: {:?}",
                lock.status
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(restarted, "the master was killed and restarted mid-run");
    assert_eq!(granted.len(), JOBS, "every Job was granted: {granted:?}");
    assert!(most_at_once <= PERMITS);
    assert!(most_at_once > 1, "the permits ran Jobs side by side: {granted:?}");
    for (job, permit, _) in &granted {
        assert!((*permit as usize) < PERMITS, "{job} was granted permit {permit}");
    }
    for permit in 0..PERMITS as u32 {
        let tokens: Vec<i64> = granted
            .iter()
            .filter(|(_, of, _)| *of == permit)
            .map(|(_, _, token)| *token)
            .collect();
        assert!(
            tokens.windows(2).all(|pair| pair[0] < pair[1]),
            "permit {permit}'s tokens rise grant after grant: {granted:?}"
        );
    }
    eventually("every permit released once the queue is done", || async {
        let lock = env.locks().get("batch").await.ok()?;
        let status = lock.status?;
        (status.held.as_deref() == Some("0/3") && status.holders.is_empty()).then_some(())
    })
    .await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Issue 23: spec.permits lowered on a held Job semaphore. The Jobs holding the permits above the new count are
/// not stopped: they run to their end (here, until deleted), and only then are their permits released; no
/// waiting Job starts until a permit under the new count is free, and then only on it. Every look asserts that
/// no Job of the first three was suspended and that Jobs started after the change run one at a time on permit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_semaphore_lowered_under_its_jobs_lets_them_finish_and_then_runs_one_at_a_time() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    let first = ["long-0", "long-1", "long-2"];
    for name in first {
        create_job(&env, name, Some(10), true, 0, Work::Seconds(3_600)).await;
    }
    for name in ["next-0", "next-1"] {
        create_job(&env, name, None, true, 0, Work::Seconds(1)).await;
    }
    let (quorum, running, shutdown) = start_semaphore((&masters, "6s"), &env, 43, "3s", 3).await;
    lock_where(&env, "batch", "3/3 held", |lock| {
        lock.status.as_ref().and_then(|status| status.held.as_deref()) == Some("3/3")
    })
    .await;
    let granted = semaphore_grants(&env).await;
    let permit_of = |job: &str| {
        granted
            .iter()
            .find(|(name, ..)| name == job)
            .and_then(|(_, _, _, grant)| grant.map(|(permit, _)| permit))
            .expect("a first Job was granted")
    };
    let on_permit_0 = first
        .into_iter()
        .find(|job| permit_of(job) == 0)
        .expect("a first Job holds permit 0");

    let patch = serde_json::json!({ "spec": { "permits": 1 } });
    env.locks()
        .patch("batch", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("lower spec.permits");
    // What holds at every look from here on.
    let look = || async {
        let grants = semaphore_grants(&env).await;
        for (job, done, runs, _) in &grants {
            if first.contains(&job.as_str()) {
                assert!(
                    *runs || *done,
                    "{job} was stopped: the count was lowered under it"
                );
            }
        }
        let later: Vec<&SemaphoreJob> = grants
            .iter()
            .filter(|(job, done, runs, _)| !first.contains(&job.as_str()) && *runs && !done)
            .collect();
        assert!(
            later.len() <= 1,
            "Jobs started after the change run side by side: {later:?}"
        );
        for (job, _, _, grant) in &later {
            // A lock of one permit again grants without a permit annotation: permit 0.
            let permit = grant.map_or(0, |(permit, _)| permit);
            assert_eq!(permit, 0, "{job} runs on a permit above the count");
        }
        let running_first = grants
            .iter()
            .filter(|(job, done, runs, _)| first.contains(&job.as_str()) && *runs && !done)
            .count();
        if running_first > 0 {
            assert!(
                later.is_empty(),
                "a waiting Job started while a first one holds: {grants:?}"
            );
        }
        grants
    };
    lock_where(&env, "batch", "3/1 held: the three keep their permits", |lock| {
        lock.status.as_ref().and_then(|status| status.held.as_deref()) == Some("3/1")
    })
    .await;
    look().await;
    for job in first.iter().filter(|job| **job != on_permit_0) {
        jobs(&env)
            .delete(job, &DeleteParams::background())
            .await
            .expect("delete a Job holding a permit above the count");
    }
    eventually(
        "the permits above the count released once their Jobs are gone",
        || async {
            look().await;
            let lock = env.locks().get("batch").await.expect("lock");
            let status = lock.status.unwrap_or_default();
            (status.held.as_deref() == Some("1/1") && status.holders.is_empty()).then_some(())
        },
    )
    .await;
    look().await;
    jobs(&env)
        .delete(on_permit_0, &DeleteParams::background())
        .await
        .expect("delete the Job on permit 0");
    eventually("the waiting Jobs ran, one at a time", || async {
        let grants = look().await;
        grants
            .iter()
            .filter(|(job, ..)| job.starts_with("next-"))
            .all(|(_, done, ..)| *done)
            .then_some(())
    })
    .await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}
