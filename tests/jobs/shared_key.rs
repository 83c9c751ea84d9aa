//! Two clusters' Job queues on one shared key (issue 31).

use super::*;

/// Issue 31: two clusters' Job queues on a shared key are served in the order their Jobs asked. Each cluster's
/// lock waits in the key's fair queue on behalf of its queue's head, so the clusters take turns as their Jobs
/// arrived. Each cluster is a test API server of its own, with its own Job controller and operator; only the
/// masters are shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_jobs_on_a_shared_key_run_in_the_order_they_asked() {
    let masters = RedisCluster::start(3).expect("masters");
    let east = Env::test_server().await;
    let west = Env::test_server().await;
    let _east_jobs = job_runtime(&east);
    let _west_jobs = job_runtime(&west);
    let mut clusters = Vec::new();
    for (env, seed) in [(&east, 41u8), (&west, 42)] {
        let quorum = env.unique("q");
        env.create_quorum_from(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": quorum },
            "spec": { "endpoints": masters.urls(), "maxTtl": "6s", "nodeTimeout": "100ms",
                      "sharedKeys": { "namespaces": [env.namespace], "prefix": "shared:" } }
        }))
        .await;
        let (running, shutdown) = operator(env, &installation_secret(seed), None).await;
        quorum_available(env, &quorum).await;
        env.create_lock_from(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
            "metadata": { "name": "batch" },
            "spec": { "quorum": quorum, "ttl": "3s", "resourceKey": "reports", "holder": { "jobs": {} } }
        }))
        .await;
        clusters.push((quorum, running, shutdown));
    }
    let queued_next = |lock: &redlock_operator::api::DistributedLock| {
        phase(lock) == Some(LockPhase::Contended)
            && lock.status.as_ref().and_then(|status| status.queue_place) == Some(1)
    };
    // Arrivals, each once the one before runs or waits: east's e1 (which runs until it is deleted, so that
    // the others arrive while it holds the key, however slow the API servers), west's w1, east's e2, west's w2.
    create_job(&east, "e1", None, true, 0, Work::Seconds(600)).await;
    let first = wait_for_grant_after(&east, "e1", 0).await;
    create_job(&west, "w1", None, true, 0, Work::Seconds(2)).await;
    lock_where(&west, "batch", "west next in the key's queue", queued_next).await;
    // Issue 41: while it waits behind e1, west's lock asks the masters again and again, but lists its pods only
    // once it has won the key (each attempt used to list them first).
    let west_server = west.server.as_ref().expect("the test server");
    let west_metrics = clusters[1].1.metrics_addr;
    let attempts = || async {
        metric(west_metrics, "redlock_acquire_duration_seconds_count")
            .await
            .unwrap_or(0.0)
    };
    // The recount's lists select the lock's pods; the pod cache's relists (a watch ended with 410) do not.
    let recounts = || west_server.operator_lists_selecting("pods", "redlock.io/lock=");
    let (lists_before, attempts_before) = (recounts(), attempts().await);
    // West's first attempt, before it had a place in the queue, counted the pods first: the count sees them.
    assert!(lists_before > 0, "no recount of west's pods was ever counted");
    eventually("west to ask the masters three more times", || async {
        (attempts().await >= attempts_before + 3.0).then_some(())
    })
    .await;
    let lists = recounts() - lists_before;
    println!(
        "west's queued lock: {} attempts, {lists} pod lists",
        attempts().await - attempts_before
    );
    assert_eq!(
        lists, 0,
        "a queued Job lock listed its pods while it could not hold"
    );
    create_job(&east, "e2", None, true, 0, Work::Seconds(2)).await;
    create_job(&west, "w2", None, true, 0, Work::Seconds(2)).await;
    jobs(&east)
        .delete("e1", &Default::default())
        .await
        .expect("delete e1");

    // The key's tokens rise in grant order, across the clusters: each Job's grant is above the one before it
    // in arrival order only if the clusters took turns as their Jobs asked.
    let mut tokens = vec![("e1", first)];
    for (env, job) in [(&west, "w1"), (&east, "e2"), (&west, "w2")] {
        let token = eventually(&format!("{job} to be granted"), || async {
            let (_, shown) = job_state(env, job).await;
            shown?.parse::<i64>().ok()
        })
        .await;
        tokens.push((job, token));
    }
    assert!(
        tokens.windows(2).all(|pair| pair[0].1 < pair[1].1),
        "the clusters' Jobs ran out of the order they asked in: {tokens:?}"
    );
    for ((quorum, running, shutdown), env) in clusters.into_iter().zip([&east, &west]) {
        stop(running, shutdown).await;
        env.cleanup(&[&quorum]).await;
    }
}
