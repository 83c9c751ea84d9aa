//! Holders outside Kubernetes: `redlock-operator lock` processes (the real binary) on the clusters' shared keys,
//! straight to the masters, with `--permits N` on a semaphore's key. Each runs a child that writes when it starts
//! (with its permit and token: `REDLOCK_PERMIT`, `REDLOCK_FENCING_TOKEN`) and when it stops (on
//! SIGTERM, when the lock is lost, or when its work is done) to one FIFO shared by every child: writes of a line
//! to a pipe are atomic and read in the order they were made, so one child's stop is always seen before the
//! start of a child that began after it. A child stopped without a word (SIGKILL) believes until its `lock`
//! process is gone, which is later, never earlier.
//!
//! In the fenced mode (`fenced.rs`) each child writes the protected resource itself, a fenced ConfigMap, with the
//! kube-rs example client (`examples/fenced_write.rs`) every `FENCED_WRITE_EVERY`, and reports each write's answer
//! on the FIFO; the harness does not write for it. Each `lock` process runs in a process group of its own, and its
//! child in another (as `lock` starts it), so that the nemesis can pause a holder as a whole.

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
use super::protected::Write;
use super::recorder::{ACT_INTERVAL, Belief, Recorder};

/// The child: says it started, with its token and the permit it believes it holds (`REDLOCK_PERMIT` modulo
/// `COUNTED`: the permit itself, unless the client miscounts); says it stops when told to stop, or when its work
/// is done.
const CHILD: &str = "echo \"start $RUN $REDLOCK_FENCING_TOKEN $((REDLOCK_PERMIT % COUNTED)) $$\" >> \"$FIFO\"; \
     trap 'echo \"stop $RUN\" >> \"$FIFO\"; exit 0' TERM; sleep \"$HOLD\" & wait $!; echo \"stop $RUN\" >> \"$FIFO\"";

/// The fenced mode's child: says it started (with its process group, `$$`: `lock` makes it the leader of one),
/// then writes the fenced object `$OBJECT` `$WRITES` times, `$EVERY` apart, each time with the token it was granted
/// with, and reports each answer with the number of writes it has left: `wrote … TOKEN LEFT RESOURCE_VERSION`, or
/// `refused-1 … TOKEN LEFT` when the API server refused it (403), `refused-2` on any other failure. A SIGTERM only
/// ends the loop: the answer of a write under way is reported first, so that no accepted write goes unlogged.
const FENCED_CHILD: &str = "echo \"start $RUN $REDLOCK_FENCING_TOKEN $((REDLOCK_PERMIT % COUNTED)) $$\" >> \"$FIFO\"; \
     stopping=; trap 'stopping=1' TERM; left=$WRITES; \
     while [ \"$left\" -gt 0 ] && [ -z \"$stopping\" ]; do left=$((left-1)); \
       if out=$(REDLOCK_FENCING_TOKEN_FILE= \"$WRITER\" --namespace \"$NAMESPACE\" \"$OBJECT\" \"token=$REDLOCK_FENCING_TOKEN\" 2>&1); \
       then rv=${out##*resourceVersion }; echo \"wrote $RUN $REDLOCK_FENCING_TOKEN $left ${rv%)}\" >> \"$FIFO\"; \
       else echo \"refused-$? $RUN $REDLOCK_FENCING_TOKEN $left\" >> \"$FIFO\"; fi; \
       sleep \"$EVERY\" & wait $!; \
     done; echo \"stop $RUN\" >> \"$FIFO\"";

/// How often a fenced mode's child writes: each write starts a process of the example client.
pub const FENCED_WRITE_EVERY: Duration = Duration::from_millis(200);

/// What a fenced mode's children write with: the example client, a kubeconfig of the first cluster, and the run's
/// namespace there.
#[derive(Clone, Debug)]
pub struct FencedWriter {
    pub binary: PathBuf,
    pub kubeconfig: PathBuf,
    pub namespace: String,
}

/// The `lock` processes and children that run now, by run: what the nemesis needs to pause a holder.
#[derive(Clone, Debug, Default)]
pub struct Running {
    /// The `lock` process (the leader of its own process group).
    pub lock: Option<i32>,
    /// The child's process group, once it said it started, with the key, holder and token it believes in.
    pub child_group: Option<i32>,
    pub key: String,
    pub holder: String,
    pub token: i64,
    /// The writes its child has still to make (the fenced mode).
    pub writes_left: u32,
    /// The nemesis paused it once already.
    pub paused: bool,
}

pub type RunningRuns = Arc<std::sync::Mutex<BTreeMap<u64, Running>>>;

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
    /// The fenced mode: its children write the fenced object themselves.
    pub fenced: Option<FencedWriter>,
}

/// The outside clients of a run: the FIFO their children write to, and the runs whose `lock` process exited.
pub struct Outside {
    fifo: PathBuf,
    exited: mpsc::UnboundedSender<u64>,
    paused: mpsc::UnboundedSender<(u64, Instant)>,
    pub running: RunningRuns,
    _dir: tempfile::TempDir,
}

impl Outside {
    /// Starts following the children's FIFO until `stop`; their beliefs go to `recorder`.
    /// In the fenced mode (`fenced`) the children write themselves: the harness does not act for them.
    pub fn start(
        recorder: Arc<Recorder>,
        fenced: bool,
        stop: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("children");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success(), "mkfifo failed");
        let (exited, exits) = mpsc::unbounded_channel();
        let (paused, pauses) = mpsc::unbounded_channel();
        let running = RunningRuns::default();
        let channels = Channels {
            exits,
            pauses,
            running: running.clone(),
        };
        let task = tokio::spawn(follow(fifo.clone(), channels, (recorder, fenced), stop));
        (
            Self {
                fifo,
                exited,
                paused,
                running,
                _dir: dir,
            },
            task,
        )
    }

    /// Run `run`'s holder was paused at `at` (SIGSTOP): it believes no longer (a stopped process acts on nothing),
    /// and whatever it writes once continued is judged by the protected resource alone.
    pub fn paused(&self, run: u64, at: Instant) {
        let _ = self.paused.send((run, at));
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
            fenced,
        } = client;
        let (fifo, exited) = (self.fifo.clone(), self.exited.clone());
        let running = self.running.clone();
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut runs = 0u64;
            while !stop.is_cancelled() {
                let (key, permits) = keys[rng.random_range(0..keys.len())].clone();
                // In the fenced mode a child makes a write every `FENCED_WRITE_EVERY` while it holds.
                let holds = if fenced.is_some() {
                    1_000..3_000
                } else {
                    100..1_000
                };
                let hold = Duration::from_millis(rng.random_range(holds));
                let pause = Duration::from_millis(rng.random_range(50..500));
                // Run ids are unique across clients: the client's index in the low bits.
                let run = runs * 64 + index as u64;
                runs += 1;
                let used = permits + usize::from(miscounting);
                let permits = (used, permits);
                let how = How {
                    fifo: &fifo,
                    fenced: fenced.as_ref(),
                    running: &running,
                };
                one_run(index, run, (&masters, ttl), (&key, permits), hold, how).await;
                running.lock().unwrap_or_else(|e| e.into_inner()).remove(&run);
                let _ = exited.send(run);
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = stop.cancelled() => {}
                }
            }
        })
    }
}

/// Where a run's child reports, how it writes in the fenced mode, and where its `lock` process is registered.
struct How<'a> {
    fifo: &'a Path,
    fenced: Option<&'a FencedWriter>,
    running: &'a RunningRuns,
}

/// One `lock` run on `key` with `--permits used`, whose child believes it holds a permit of `counted`.
async fn one_run(
    index: usize,
    run: u64,
    (masters, ttl): (&[String], Duration),
    (key, (used, counted)): (&str, (usize, usize)),
    hold: Duration,
    how: How<'_>,
) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_redlock-operator"));
    let child_script = match how.fenced {
        Some(writer) => {
            let every = FENCED_WRITE_EVERY.as_secs_f64();
            let writes = (hold.as_secs_f64() / every).ceil().max(1.0);
            command
                .env("WRITER", &writer.binary)
                .env("KUBECONFIG", &writer.kubeconfig)
                .env("NAMESPACE", &writer.namespace)
                .env("OBJECT", super::fenced::object_name(key))
                .env("WRITES", format!("{writes:.0}"))
                .env("EVERY", format!("{every:.3}"));
            FENCED_CHILD
        }
        None => CHILD,
    };
    let spawned = command
        .arg("lock")
        .env("REDLOCK_REDIS", masters.join(","))
        .env("COUNTED", counted.to_string())
        .env("HOLD", format!("{:.3}", hold.as_secs_f64()))
        .env("RUN", format!("{run} outside/outside-{index} {key}"))
        .env("FIFO", how.fifo)
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
            child_script,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // A group of its own: the nemesis pauses it without pausing the harness.
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    if let Ok(mut child) = spawned {
        let pid = child.id().and_then(|id| i32::try_from(id).ok());
        how.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(run)
            .or_default()
            .lock = pid;
        let _ = child.wait().await;
    }
}

/// What the FIFO's reader learns besides the children's lines.
struct Channels {
    /// Runs whose `lock` process exited.
    exits: mpsc::UnboundedReceiver<u64>,
    /// Runs whose holder the nemesis paused, and when.
    pauses: mpsc::UnboundedReceiver<(u64, Instant)>,
    running: RunningRuns,
}

/// Reads the children's lines in the order they were written; the children believe (and act) in between.
async fn follow(
    fifo: PathBuf,
    channels: Channels,
    (recorder, fenced): (Arc<Recorder>, bool),
    stop: CancellationToken,
) {
    let Channels {
        mut exits,
        mut pauses,
        running,
    } = channels;
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
                    ["start", run, holder, key, token, permit, group] => {
                        let (Ok(run), Ok(token), Ok(permit)) = (run.parse(), token.parse(), permit.parse())
                        else {
                            continue;
                        };
                        {
                            let mut running = running.lock().unwrap_or_else(|e| e.into_inner());
                            let entry = running.entry(run).or_default();
                            entry.child_group = group.parse().ok();
                            (entry.key, entry.holder, entry.token) =
                                ((*key).to_owned(), (*holder).to_owned(), token);
                        }
                        let belief = Belief {
                            key: permit_resource(key, permit),
                            holder: (*holder).to_owned(),
                            token,
                            start: now,
                            // The `lock` process stops its child before the lock's validity ends.
                            fence_at: now + Duration::from_secs(24 * 3600),
                            evidence: format!("`lock` child started with permit {permit} and token {token}"),
                        };
                        if !fenced {
                            belief.act(&recorder);
                        }
                        believing.insert(run, belief);
                    }
                    [answer, run, holder, key, token, left, rest @ ..] if answer.starts_with("refused-")
                        || *answer == "wrote" =>
                    {
                        if let (Ok(run), Ok(left)) = (run.parse::<u64>(), left.parse()) {
                            let mut running = running.lock().unwrap_or_else(|e| e.into_inner());
                            if let Some(entry) = running.get_mut(&run) {
                                entry.writes_left = left;
                            }
                        }
                        // A refusal of the API server's (403); any other failure is no answer on the write.
                        if !matches!(*answer, "wrote" | "refused-1") {
                            continue;
                        }
                        let Ok(token) = token.parse() else { continue };
                        let accepted = *answer == "wrote";
                        // An accepted write the API server's order does not place is taken as its last: the
                        // check may then see a stale write that was not, never miss one.
                        let order = rest
                            .first()
                            .and_then(|rv| rv.parse().ok())
                            .unwrap_or(if accepted { u64::MAX } else { 0 });
                        recorder.resource.record(Write {
                            key: (*key).to_owned(),
                            token,
                            holder: (*holder).to_owned(),
                            at: now,
                            accepted,
                            order,
                        });
                    }
                    ["stop", run, ..] => {
                        if let Some(belief) = run.parse().ok().and_then(|run| believing.remove(&run)) {
                            belief.end(&recorder, now, "the child stopped");
                        }
                    }
                    _ => {}
                }
            }
            Some((run, at)) = pauses.recv() => {
                if let Some(belief) = believing.remove(&run) {
                    belief.end(&recorder, at, "its holder was paused (SIGSTOP)");
                }
            }
            Some(run) = exits.recv() => {
                if let Some(belief) = believing.remove(&run) {
                    belief.end(&recorder, Instant::now(), "its `lock` process exited");
                }
            }
            () = tokio::time::sleep_until(next_act) => {
                for belief in believing.values().filter(|_| !fenced) {
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
