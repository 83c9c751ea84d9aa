//! Holders outside Kubernetes: `redlock-operator lock` processes (the real binary) on the clusters' shared keys,
//! straight to the masters, with `--permits N` on a semaphore's key. Each runs a child that writes when it starts
//! (with its permit and token: `REDLOCK_PERMIT`, `REDLOCK_FENCING_TOKEN`) and when it stops (on
//! SIGTERM, when the lock is lost, or when its work is done) to one FIFO shared by every child: writes of a line
//! to a pipe are atomic and read in the order they were made, so one child's stop is always seen before the
//! start of a child that began after it. A child stopped without a word (SIGKILL) believes until its `lock`
//! process is gone, which is later, never earlier.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::permits::permit_resource;
use super::recorder::{ACT_INTERVAL, Belief, Recorder};

/// The child: says it started, with its token and the permit it believes it holds (`REDLOCK_PERMIT` modulo
/// `COUNTED`: the permit itself, unless the client miscounts); says it stops when told to stop, or when its work
/// is done.
const CHILD: &str = "echo \"start $RUN $REDLOCK_FENCING_TOKEN $((REDLOCK_PERMIT % COUNTED))\" >> \"$FIFO\"; \
     trap 'echo \"stop $RUN\" >> \"$FIFO\"; exit 0' TERM; sleep \"$HOLD\" & wait $!; echo \"stop $RUN\" >> \"$FIFO\"";

/// One outside client.
pub struct Client {
    /// Its number: its holder name is `outside-<index>`.
    pub index: usize,
    pub masters: Vec<String>,
    /// The keys it takes, each with its permits.
    pub keys: Vec<(String, usize)>,
    pub seed: u64,
    /// The semaphore mode's negative control: it runs `lock` with one permit more than the key has and believes
    /// it holds its permit number modulo the key's permits (the permit above them is, to it, permit 0).
    pub miscounting: bool,
    /// Its `--ttl` and `--max-ttl` (the quorum's).
    pub ttl: Duration,
}

/// The outside clients of a run: the FIFO their children write to, and the runs whose `lock` process exited.
pub struct Outside {
    fifo: PathBuf,
    exited: mpsc::UnboundedSender<u64>,
    _dir: tempfile::TempDir,
}

impl Outside {
    /// Starts following the children's FIFO until `stop`; their beliefs go to `recorder`.
    pub fn start(recorder: Arc<Recorder>, stop: CancellationToken) -> (Self, tokio::task::JoinHandle<()>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("children");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success(), "mkfifo failed");
        let (exited, exits) = mpsc::unbounded_channel();
        let task = tokio::spawn(follow(fifo.clone(), exits, recorder, stop));
        (
            Self {
                fifo,
                exited,
                _dir: dir,
            },
            task,
        )
    }

    /// One outside client, taking one of its keys after another until `stop`.
    pub fn client(&self, client: Client, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let Client {
            index,
            masters,
            keys,
            seed,
            miscounting,
            ttl,
        } = client;
        let (fifo, exited) = (self.fifo.clone(), self.exited.clone());
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut runs = 0u64;
            while !stop.is_cancelled() {
                let (key, permits) = keys[rng.random_range(0..keys.len())].clone();
                let hold = Duration::from_millis(rng.random_range(100..1_000));
                let pause = Duration::from_millis(rng.random_range(50..500));
                // Run ids are unique across clients: the client's index in the low bits.
                let run = runs * 64 + index as u64;
                runs += 1;
                let used = permits + usize::from(miscounting);
                let permits = (used, permits);
                one_run(index, run, (&masters, ttl), (&key, permits), hold, &fifo).await;
                let _ = exited.send(run);
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = stop.cancelled() => {}
                }
            }
        })
    }
}

/// One `lock` run on `key` with `--permits used`, whose child believes it holds a permit of `counted`.
async fn one_run(
    index: usize,
    run: u64,
    (masters, ttl): (&[String], Duration),
    (key, (used, counted)): (&str, (usize, usize)),
    hold: Duration,
    fifo: &Path,
) {
    let spawned = tokio::process::Command::new(env!("CARGO_BIN_EXE_redlock-operator"))
        .arg("lock")
        .env("REDLOCK_REDIS", masters.join(","))
        .env("COUNTED", counted.to_string())
        .env("HOLD", format!("{:.3}", hold.as_secs_f64()))
        .env("RUN", format!("{run} outside/outside-{index} {key}"))
        .env("FIFO", fifo)
        .env_remove("RUST_LOG")
        .args([
            "--ttl",
            &super::duration_text(ttl),
            "--max-ttl",
            &super::duration_text(ttl),
            "--node-timeout",
            "100ms",
        ])
        .args([
            "--wait",
            "3s",
            "--holder",
            &format!("outside-{index}"),
            "--permits",
            &used.to_string(),
            key,
            "--",
            "sh",
            "-c",
            CHILD,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn();
    if let Ok(mut child) = spawned {
        let _ = child.wait().await;
    }
}

/// Reads the children's lines in the order they were written; the children believe (and act) in between.
async fn follow(
    fifo: PathBuf,
    mut exits: mpsc::UnboundedReceiver<u64>,
    recorder: Arc<Recorder>,
    stop: CancellationToken,
) {
    // Read and write: the FIFO stays open when no child has it open, instead of reading end-of-file.
    let receiver = tokio::net::unix::pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(&fifo)
        .expect("open the FIFO");
    let mut lines = BufReader::new(receiver).lines();
    let mut believing: BTreeMap<u64, Belief> = BTreeMap::new();
    let mut next_act = Instant::now() + ACT_INTERVAL;
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            line = lines.next_line() => {
                let Ok(Some(line)) = line else { break };
                let now = Instant::now();
                let words: Vec<&str> = line.split_whitespace().collect();
                match words.as_slice() {
                    ["start", run, holder, key, token, permit] => {
                        let (Ok(run), Ok(token), Ok(permit)) = (run.parse(), token.parse(), permit.parse())
                        else {
                            continue;
                        };
                        let belief = Belief {
                            key: permit_resource(key, permit),
                            holder: (*holder).to_owned(),
                            token,
                            start: now,
                            // The `lock` process stops its child before the lock's validity ends.
                            fence_at: now + Duration::from_secs(24 * 3600),
                            evidence: format!("`lock` child started with permit {permit} and token {token}"),
                        };
                        belief.act(&recorder);
                        believing.insert(run, belief);
                    }
                    ["stop", run, ..] => {
                        if let Some(belief) = run.parse().ok().and_then(|run| believing.remove(&run)) {
                            belief.end(&recorder, now, "the child stopped");
                        }
                    }
                    _ => {}
                }
            }
            Some(run) = exits.recv() => {
                if let Some(belief) = believing.remove(&run) {
                    belief.end(&recorder, Instant::now(), "its `lock` process exited");
                }
            }
            () = tokio::time::sleep_until(next_act) => {
                for belief in believing.values() {
                    belief.act(&recorder);
                }
                next_act = Instant::now() + ACT_INTERVAL;
            }
        }
    }
    let now = Instant::now();
    for (_, belief) in std::mem::take(&mut believing) {
        belief.end(&recorder, now, "the run ended");
    }
}
