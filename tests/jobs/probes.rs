//! What the Job tests look at: the Jobs, their pods and the lock, and the waits built on them (each checking
//! that no two grants run at once).

use super::*;

/// Whether the Job may run (unsuspended), and the token in its pod template.
pub(super) async fn job_state(env: &Env, name: &str) -> (bool, Option<String>) {
    let job = jobs(env).get(name).await.expect("job");
    let spec = job.spec.expect("spec");
    let token = spec
        .template
        .metadata
        .and_then(|meta| meta.annotations)
        .and_then(|annotations| annotations.get("redlock.io/fencing-token").cloned());
    (!spec.suspend.unwrap_or(false), token)
}

/// Jobs that may run now: unsuspended and not finished.
pub(super) async fn running_jobs(env: &Env) -> Vec<String> {
    let mut names = Vec::new();
    for job in jobs(env).list(&ListParams::default()).await.expect("jobs").items {
        if !job_finished(&job) && !job.spec.as_ref().and_then(|spec| spec.suspend).unwrap_or(false) {
            names.push(job.metadata.name.clone().unwrap_or_default());
        }
    }
    names
}

/// The pods that run (or are still stopping) with a fencing token, by the token they carry.
pub(super) async fn live_granted_pods(env: &Env) -> Vec<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    pods.list(&ListParams::default())
        .await
        .expect("pods")
        .items
        .into_iter()
        .filter(|pod| {
            let phase = pod.status.as_ref().and_then(|status| status.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter_map(|pod| {
            let token = pod.annotations().get("redlock.io/fencing-token")?.clone();
            Some((pod.name_any(), token))
        })
        .collect()
}

/// The invariant Job fencing exists for, checked on the pods themselves: at no time do pods of two grants
/// (two tokens) run or stop at once.
pub(super) async fn assert_one_grant_running(env: &Env) {
    let pods = live_granted_pods(env).await;
    let tokens: std::collections::BTreeSet<&str> = pods.iter().map(|(_, token)| token.as_str()).collect();
    assert!(tokens.len() <= 1, "pods of two grants at once: {pods:?}");
    let running = running_jobs(env).await;
    assert!(running.len() <= 1, "two Jobs run at once: {running:?}");
}

/// Ends the deletion of the pods carrying `token` at once, as `kubectl delete --force --grace-period=0` does.
pub(super) async fn force_delete_pods_of_grant(env: &Env, token: i64) {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let at_once = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for (pod, shown) in live_granted_pods(env).await {
        if shown == token.to_string() {
            let _ = pods.delete(&pod, &at_once).await;
        }
    }
}

/// Waits until `job` is the only running Job, granted with `token`.
/// On a timeout it says what the Job and the lock showed last, so that a failure tells a grant that never came
/// from one with another token.
pub(super) async fn wait_for_grant(env: &Env, job: &str, token: i64) {
    let mut last = (false, None);
    let waited = crate::support::poll::until(PATIENCE, Duration::from_millis(20), async || {
        assert_one_grant_running(env).await;
        last = job_state(env, job).await;
        (last.0 && last.1 == Some(token.to_string())).then_some(())
    })
    .await;
    if let Err(waited) = waited {
        let lock = env.locks().get("batch").await.ok();
        let status = lock.and_then(|lock| lock.status);
        let held = status
            .as_ref()
            .and_then(|status| condition(&status.conditions, "Held"))
            .map(|held| format!("{}: {}", held.reason, held.message));
        panic!(
            "timed out waiting for {job} granted with token {token} ({waited:?}); it last ran: {}, with token {:?}; \
             the lock shows holder {:?}, token {:?}, Held {held:?}",
            last.0,
            last.1,
            status.as_ref().and_then(|status| status.holder.clone()),
            status.as_ref().and_then(|status| status.fencing_token),
        );
    }
}

/// Waits until `job` is the only running Job, granted with a token above `previous`, and returns that token.
/// After a fault the next token is not always `previous + 1`: an acquisition that reached no majority (a master
/// still quarantined after its restart, say) may have raised the counters it did reach, and tokens only promise
/// to grow.
pub(super) async fn wait_for_grant_after(env: &Env, job: &str, previous: i64) -> i64 {
    eventually(
        &format!("{job} granted with a token above {previous}"),
        || async {
            assert_one_grant_running(env).await;
            let (runs, shown) = job_state(env, job).await;
            let token: i64 = shown?.parse().ok()?;
            (runs && token > previous).then_some(token)
        },
    )
    .await
}

/// Waits until a pod of the running grant is up (its image pulled, on a real cluster).
pub(super) async fn wait_for_pod_running(env: &Env, token: i64) {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    eventually(&format!("a running pod with token {token}"), || async {
        assert_one_grant_running(env).await;
        let list = pods.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|pod| {
                pod.annotations().get("redlock.io/fencing-token") == Some(&token.to_string())
                    && pod.status.as_ref().and_then(|status| status.phase.as_deref()) == Some("Running")
            })
            .then_some(())
    })
    .await;
}

/// Waits for the lock's `Held` condition to have `reason`, checking the invariant meanwhile.
pub(super) async fn wait_for_reason(env: &Env, reason: &str) {
    eventually(&format!("the lock's Held condition to say {reason}"), || async {
        assert_one_grant_running(env).await;
        let lock = env.locks().get("batch").await.ok()?;
        let held = lock
            .status
            .as_ref()
            .and_then(|s| condition(&s.conditions, "Held"))?;
        (held.reason == reason).then_some(())
    })
    .await;
}

pub(super) async fn job_events(env: &Env, name: &str) -> Vec<String> {
    event_reasons(&env.events(), Some("Job"), name).await
}

pub(super) async fn wait_for_suspension(env: &Env, job: &str) {
    eventually(&format!("{job} to be suspended"), || async {
        (!job_state(env, job).await.0).then_some(())
    })
    .await;
}
