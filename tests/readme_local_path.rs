//! The README's "Try it from your machine" path, run as written so that it cannot rot: its blocks marked
//! `<!-- local-path: … -->` are run in order with bash and the real `kubectl` (scripts/install-tools.sh puts it
//! under target/tools/bin) against the in-process test API server, or against the cluster
//! `REDLOCK_E2E_KUBECONFIG` names. The only substitutions are the README's comment says: free ports for 7001,
//! 7002, 7003 and 8080, the kubeconfig, and the test build's `redlock-operator` on PATH. The operator block runs
//! in the background ("a second terminal") and gets SIGINT before the block marked "after Ctrl-C".
//!
//! While the README's lock is held (before its "delete" block), the tutorial that continues the path,
//! docs/tutorials/pause-a-holder.md, runs the same way: its marked blocks in order, terminal A's in the background,
//! Ctrl-Z as a terminal sends it (SIGTSTP to the block's process group) and `fg` as SIGCONT. Its only substitution
//! is the masters' ports.
//!
//! The masters the README starts are daemons (`--daemonize yes`), not children of the test: the README's own
//! last block shuts them down, and if the test fails before that, a guard shuts down each one it saw start (by
//! its run id, so that nothing else listening on a reused port is touched), and kills the operator.

use std::fs::File;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::support::apiserver::TestApiServer;
use crate::support::redis_server::free_port;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

const BIN: &str = env!("CARGO_BIN_EXE_redlock-operator");
const MARK: &str = "<!-- local-path: ";
/// Generous: a step includes `kubectl wait … --timeout=90s` while fresh masters sit out their quarantine.
const STEP_DEADLINE: Duration = Duration::from_secs(240);
const SETTLE_DEADLINE: Duration = Duration::from_secs(30);
/// The ports the README uses, in the order of the free ones that replace them.
const README_PORTS: [&str; 5] = ["7001", "7002", "7003", "8080", "8443"];

#[derive(Debug)]
struct Block {
    mark: String,
    script: String,
}

/// Every `<!-- local-path: MARK -->` followed by a fenced `sh` block, in README order.
fn marked_blocks(readme: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let Some(mark) = line
            .trim()
            .strip_prefix(MARK)
            .and_then(|rest| rest.strip_suffix("-->"))
        else {
            continue;
        };
        let fence = lines.next().unwrap_or_default();
        assert_eq!(
            fence.trim(),
            "```sh",
            "a `{mark}` mark must be followed by a ```sh block"
        );
        let script: Vec<&str> = lines.by_ref().take_while(|line| line.trim() != "```").collect();
        blocks.push(Block {
            mark: mark.trim().to_owned(),
            script: script.join("\n") + "\n",
        });
    }
    blocks
}

/// The README's ports replaced by free ones, each of which must occur (a substitution that silently no longer
/// applies would let the test use the README's fixed ports).
fn substitute(blocks: &mut [Block], ports: &[u16]) {
    for (fixed, free) in README_PORTS.iter().zip(ports) {
        let used = blocks.iter().any(|block| block.script.contains(fixed));
        assert!(
            used,
            "the README's local path no longer uses port {fixed}: update this test"
        );
        for block in blocks.iter_mut() {
            block.script = block.script.replace(fixed, &free.to_string());
        }
    }
}

/// Where the kubeconfig comes from: the in-process server (kept alive here) or the given cluster.
enum Cluster {
    InProcess {
        _server: TestApiServer,
        kubeconfig: PathBuf,
    },
    External(PathBuf),
}

impl Cluster {
    fn start(dir: &Path) -> Cluster {
        if let Ok(path) = std::env::var("REDLOCK_E2E_KUBECONFIG") {
            return Cluster::External(path.into());
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // The server runs on a thread and runtime of its own; this one only starts it.
        let server = runtime.block_on(TestApiServer::start_from_env());
        let path = dir.join("kubeconfig");
        server.write_kubeconfig(&path).expect("kubeconfig");
        Cluster::InProcess {
            _server: server,
            kubeconfig: path,
        }
    }

    fn kubeconfig(&self) -> &Path {
        match self {
            Cluster::InProcess { kubeconfig, .. } | Cluster::External(kubeconfig) => kubeconfig,
        }
    }
}

/// Stops what the README started if the test ends early: the operator's process group, and each master that
/// still answers with the run id it had when it started.
#[derive(Default)]
struct Guard {
    operator: Option<Child>,
    masters: Vec<(u16, String)>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(operator) = self.operator.as_mut() {
            if let Ok(pid) = i32::try_from(operator.id()) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = operator.wait();
        }
        for (port, run_id) in &self.masters {
            if run_id_of(*port).as_deref() == Some(run_id.as_str()) {
                let _ = redis_query(*port, &["SHUTDOWN", "NOSAVE"]);
            }
        }
    }
}

fn redis_query(port: u16, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut connection = client.get_connection_with_timeout(Duration::from_secs(1))?;
    connection.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut command = redis::cmd(args[0]);
    for arg in &args[1..] {
        command.arg(*arg);
    }
    command.query(&mut connection)
}

fn run_id_of(port: u16) -> Option<String> {
    let info: String = redis::from_redis_value(redis_query(port, &["INFO", "server"]).ok()?).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned())
}

struct Shell {
    dir: PathBuf,
    path: String,
    kubeconfig: PathBuf,
    steps: usize,
}

impl Shell {
    fn command(&self, script: &str) -> Command {
        let mut command = Command::new("bash");
        command
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("PATH", &self.path)
            .env("KUBECONFIG", &self.kubeconfig)
            // kubectl's discovery cache, out of the user's home.
            .env("KUBECACHEDIR", self.dir.join("kube-cache"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        command
    }

    /// Runs one block to its end; panics with its output if it fails.
    fn run(&mut self, block: &Block) -> String {
        self.steps += 1;
        let out = self.dir.join(format!("step-{}.out", self.steps));
        let err = self.dir.join(format!("step-{}.err", self.steps));
        let mut child = self
            .command(&block.script)
            .stdout(File::create(&out).expect("stdout file"))
            .stderr(File::create(&err).expect("stderr file"))
            .spawn()
            .expect("bash");
        let status = wait_for(&mut child, STEP_DEADLINE);
        let (stdout, stderr) = (read(&out), read(&err));
        match status {
            Some(status) if status.success() => stdout,
            other => panic!(
                "README step failed ({other:?}):\n{}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
                block.script
            ),
        }
    }

    /// Starts a block in a process group of its own, its output in `log`.
    fn spawn(&self, block: &Block, log: &Path) -> Child {
        let log = File::create(log).expect("log file");
        self.command(&block.script)
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("bash")
    }
}

fn read(path: &Path) -> String {
    let mut text = String::new();
    let _ = File::open(path).and_then(|mut file| file.read_to_string(&mut text));
    text
}

/// Waits for `child` to exit, at most `deadline`; kills it (and returns `None`) after that.
fn wait_for(child: &mut Child, deadline: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        if Instant::now() >= until {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `check` until it holds, at most `deadline`.
fn eventually(what: &str, deadline: Duration, mut check: impl FnMut() -> bool) {
    if crate::support::poll::until_blocking(deadline, Duration::from_millis(50), || check().then_some(()))
        .is_err()
    {
        panic!("{what}: not within {deadline:?}");
    }
}

fn install_kubectl() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new(root.join("scripts/install-tools.sh"))
        .arg("kubectl")
        .stdin(Stdio::null())
        .output()
        .expect("scripts/install-tools.sh");
    assert!(
        output.status.success(),
        "scripts/install-tools.sh kubectl failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    root.join("target/tools/bin")
}

#[test]
fn the_readme_local_path_works_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let mut blocks = marked_blocks(&readme);
    let marks: Vec<&str> = blocks.iter().map(|block| block.mark.as_str()).collect();
    assert_eq!(
        marks,
        [
            "run",
            "run in a second terminal",
            "run",
            "run",
            "run after Ctrl-C in the second terminal"
        ],
        "the marked blocks of the README's local path"
    );
    let ports = [(); 5].map(|()| free_port().expect("a free port"));
    substitute(&mut blocks, &ports);
    let master_ports = &ports[..3];

    let dir = tempfile::tempdir().expect("temp dir");
    let tools = install_kubectl();
    let bin_dir = Path::new(BIN).parent().expect("the binary's directory");
    let cluster = Cluster::start(dir.path());
    let mut shell = Shell {
        dir: dir.path().to_owned(),
        path: format!(
            "{}:{}:{}",
            tools.display(),
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
        kubeconfig: cluster.kubeconfig().to_owned(),
        steps: 0,
    };
    let mut guard = Guard::default();
    let operator_log = dir.path().join("operator.log");

    // 1. The masters and the CRDs.
    let [start, operator, lock, delete, stop] = &blocks[..] else {
        unreachable!("five blocks, checked above")
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| shell.run(start)));
    // Whatever the step did, the masters that came up are stopped at the end.
    for &port in master_ports {
        if let Some(run_id) = run_id_of(port) {
            guard.masters.push((port, run_id));
        }
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    assert_eq!(guard.masters.len(), 3, "three masters answer on {master_ports:?}");

    // 2. The operator, "in a second terminal".
    guard.operator = Some(shell.spawn(operator, &operator_log));

    // 3. The quorum and the lock: held, and shown so by `kubectl get` (the server's Table of printer columns).
    let shown = shell.run(lock);
    let header = shown
        .lines()
        .find(|line| line.starts_with("NAME"))
        .unwrap_or_default();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        [
            "NAME",
            "HOLDER",
            "PHASE",
            "PLACE",
            "HELD",
            "TOKEN",
            "VALID-UNTIL",
            "QUORUM",
            "AGE"
        ],
        "{shown}"
    );
    let row: Vec<&str> = shown
        .lines()
        .find(|line| line.starts_with("nightly-report"))
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert!(
        row.len() == 8
            && row[1] == "report-runner"
            && row[2] == "Held"
            && row[3] == "1/1"
            && row[6].ends_with("/3"),
        "the lock is held, as the README shows it: {shown}\n--- operator\n{}",
        read(&operator_log)
    );
    let key = format!("{}/nightly-report", namespace(&shell));
    let holding = master_ports
        .iter()
        .filter(|port| redis_query(**port, &["EXISTS", &key]).ok() == Some(redis::Value::Int(1)))
        .count();
    assert!(holding >= 2, "a majority holds the key {key}: {holding} of 3");

    // The tutorial that continues the path, while the README's lock is held.
    pause_a_holder_tutorial(&mut shell, &ports[..3]);

    // 4. Deleted while the operator runs: its finalizer releases the key on every master.
    shell.run(delete);
    eventually("the key released on every master", SETTLE_DEADLINE, || {
        master_ports
            .iter()
            .all(|port| redis_query(*port, &["EXISTS", &key]).ok() == Some(redis::Value::Int(0)))
    });

    // 5. Ctrl-C: the operator stops cleanly; then the README stops the masters.
    let operator = guard.operator.as_mut().expect("operator");
    assert!(
        operator.try_wait().expect("operator").is_none(),
        "the operator kept running until Ctrl-C: {}",
        read(&operator_log)
    );
    let group = Pid::from_raw(i32::try_from(operator.id()).expect("pid"));
    killpg(group, Signal::SIGINT).expect("SIGINT");
    let status = wait_for(operator, SETTLE_DEADLINE);
    assert!(
        status.is_some_and(|status| status.success()),
        "the operator stops on Ctrl-C ({status:?}): {}",
        read(&operator_log)
    );
    guard.operator = None;
    shell.run(stop);
    eventually("the masters stopped", SETTLE_DEADLINE, || {
        master_ports
            .iter()
            .all(|port| std::net::TcpStream::connect(("127.0.0.1", *port)).is_err())
    });
    guard.masters.clear();
}

/// The namespace `kubectl` works in: the kubeconfig's, or `default`.
fn namespace(shell: &Shell) -> String {
    let output = shell
        .command("kubectl config view --minify -o 'jsonpath={..namespace}'")
        .output()
        .expect("kubectl config view");
    let namespace = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if namespace.is_empty() {
        "default".into()
    } else {
        namespace
    }
}

/// docs/tutorials/pause-a-holder.md, as written: the policy and the fenced object; terminal A's holder writing
/// every second; Ctrl-Z; terminal B's holder taking the key once it expired and writing with a higher token;
/// terminal A's next writes refused by the API server; the object showing the second holder's write; `fg`, and
/// terminal A's `lock` stopping its command and exiting 76 (lock lost); the clean-up.
fn pause_a_holder_tutorial(shell: &mut Shell, master_ports: &[u16]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate::support::fenced_policy::helm(root);
    let text = std::fs::read_to_string(root.join("docs/tutorials/pause-a-holder.md")).expect("the tutorial");
    let mut blocks = marked_blocks(&text);
    let marks: Vec<&str> = blocks.iter().map(|block| block.mark.as_str()).collect();
    assert_eq!(
        marks,
        [
            "run",
            "run",
            "run in terminal A",
            "run in terminal B",
            "run in terminal B",
            "run"
        ],
        "the marked blocks of the tutorial"
    );
    substitute(&mut blocks, master_ports);
    let [policy, objects, first, second, shown, clean_up] = &blocks[..] else {
        unreachable!("six blocks, checked above")
    };
    shell.run(policy);
    // Removed whatever happens next: the policy is cluster-wide, and a real cluster outlives this test.
    let _policy_guard = Undo(shell.command(
        "helm template redlock ./charts/redlock-operator --show-only templates/fenced-objects-policy.yaml \
         | kubectl delete --ignore-not-found -f -",
    ));
    shell.run(objects);

    let log = shell.dir.join("terminal-a.log");
    let mut terminal_a = shell.spawn(first, &log);
    let group = Pid::from_raw(i32::try_from(terminal_a.id()).expect("pid"));
    // Killed if a step fails: stopped by Ctrl-Z, it would stay (its command dies with it, by its death signal).
    let mut terminal_a_guard = KillGroup(Some(group));
    eventually("terminal A writes the object", STEP_DEADLINE, || {
        read(&log).contains("configmap/report patched")
    });
    // Ctrl-Z: the terminal's foreground job is the block's process group (`lock` and the shell running it; the
    // command `lock` started is in a group of its own).
    killpg(group, Signal::SIGTSTP).expect("SIGTSTP");
    let refusals_before = read(&log).matches("is stale").count();
    assert_eq!(
        refusals_before,
        0,
        "nothing refused before a second holder: {}",
        read(&log)
    );

    shell.run(second);
    eventually("terminal A's next write refused", STEP_DEADLINE, || {
        read(&log).contains("is stale")
    });
    let object = shell.run(shown);
    assert!(
        object.trim_start().starts_with("second "),
        "the object keeps the second holder's write: {object}\n--- terminal A\n{}",
        read(&log)
    );

    // `fg`.
    killpg(group, Signal::SIGCONT).expect("SIGCONT");
    let status = wait_for(&mut terminal_a, STEP_DEADLINE);
    if status.is_some() {
        // Exited (after its `lock`) and reaped: its group is gone, and its number may be reused.
        terminal_a_guard.0 = None;
    }
    assert_eq!(
        status.and_then(|status| status.code()),
        Some(76),
        "terminal A's `lock` exits 76 (lock lost) once continued: {}",
        read(&log)
    );
    shell.run(clean_up);
}

/// Runs a command when dropped: what undoes a step, in case a later one fails.
struct Undo(Command);

impl Drop for Undo {
    fn drop(&mut self) {
        let _ = self.0.stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

/// SIGKILLs a process group when dropped, unless disarmed (`None`): stopped or not, SIGKILL ends it.
struct KillGroup(Option<Pid>);

impl Drop for KillGroup {
    fn drop(&mut self) {
        if let Some(group) = self.0 {
            let _ = killpg(group, Signal::SIGKILL);
        }
    }
}
