//! Holders outside Kubernetes: `redlock-operator lock` processes (the real binary) on the clusters' shared keys,
//! straight to the masters. Each runs a child that says when it starts (with its token) and when it stops: it
//! believes from the moment it started until it stopped (SIGTERM on loss of the lock, or its work done), as
//! the harness reads those lines; a child stopped without a word (SIGKILL) believes until its `lock` process
//! is gone, which is later, never earlier.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::recorder::{ACT_INTERVAL, Belief, Recorder};

/// The child: says it started, with its token; says it stops when told to stop, or when its work is done.
const CHILD: &str = "echo \"start $REDLOCK_FENCING_TOKEN\"; trap 'echo stop; exit 0' TERM; sleep \"$HOLD\" & wait $!; echo stop";

/// One outside client: takes one of `keys` after another until `stop`.
pub async fn client(
    name: String,
    masters: Vec<String>,
    keys: Vec<String>,
    seed: u64,
    recorder: Arc<Recorder>,
    stop: CancellationToken,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.is_cancelled() {
        let key = keys[rng.random_range(0..keys.len())].clone();
        let hold = Duration::from_millis(rng.random_range(100..1_500));
        let pause = Duration::from_millis(rng.random_range(50..500));
        one_run(&name, &masters, &key, hold, &recorder).await;
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stop.cancelled() => {}
        }
    }
}

async fn one_run(name: &str, masters: &[String], key: &str, hold: Duration, recorder: &Recorder) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_redlock-operator"))
        .arg("lock")
        .env("REDLOCK_REDIS", masters.join(","))
        .env("HOLD", format!("{:.3}", hold.as_secs_f64()))
        .env_remove("RUST_LOG")
        .args([
            "--ttl",
            super::TTL,
            "--max-ttl",
            super::MAX_TTL,
            "--node-timeout",
            "100ms",
        ])
        .args(["--wait", "3s", "--holder", name, key, "--", "sh", "-c", CHILD])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start redlock-operator lock");
    let Some(stdout) = child.stdout.take() else { return };
    let mut lines = BufReader::new(stdout).lines();
    let mut belief: Option<Belief> = None;
    let mut next_act = Instant::now() + ACT_INTERVAL;
    loop {
        tokio::select! {
            line = lines.next_line() => {
                let now = Instant::now();
                match line {
                    Ok(Some(line)) => {
                        if let Some(token) = line.strip_prefix("start ").and_then(|token| token.trim().parse().ok()) {
                            let started = Belief {
                                key: key.to_owned(),
                                holder: format!("outside/{name}"),
                                token,
                                start: now,
                                // The `lock` process stops its child before the lock's validity ends.
                                fence_at: now + Duration::from_secs(3600),
                                evidence: format!("`lock` child started with token {token}"),
                            };
                            started.act(recorder);
                            belief = Some(started);
                        } else if line.trim() == "stop" && let Some(ended) = belief.take() {
                            ended.end(recorder, now, "the child stopped");
                        }
                    }
                    Ok(None) | Err(_) => {
                        if let Some(ended) = belief.take() {
                            ended.end(recorder, now, "the `lock` process exited");
                        }
                        break;
                    }
                }
            }
            () = tokio::time::sleep_until(next_act), if belief.is_some() => {
                if let Some(belief) = &belief {
                    belief.act(recorder);
                }
                next_act = Instant::now() + ACT_INTERVAL;
            }
        }
    }
    let _ = child.wait().await;
}
