//! The static binary (issue 47): `lock` in a chroot that holds nothing but the binary, /etc/hosts and the masters'
//! CA, against masters it knows only by the names /etc/hosts gives them, over TLS, running the binary's own
//! `--version` as its command. A binary that links any shared library cannot even start there (no loader), one
//! that resolves names through NSS modules it loads at run time finds none, and one that reads its randomness
//! from /dev/urandom finds no /dev.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::redis_server::{Options, RedisCluster, TlsFiles};

/// The static build to run: scripts/test.sh links one (crt-static) and names it here.
const STATIC_BINARY: &str = "REDLOCK_STATIC_BINARY";

#[test]
fn lock_runs_in_a_chroot_that_holds_only_the_binary_and_etc_hosts() {
    let Some(binary) = std::env::var_os(STATIC_BINARY) else {
        eprintln!("skipped: {STATIC_BINARY} names no static build (scripts/test.sh links one and sets it)");
        return;
    };
    let work = tempfile::tempdir().expect("a temporary folder");
    let tls = TlsFiles::generate(work.path()).expect("a CA and a certificate for *.redlock.test");
    let cluster = RedisCluster::start_with(3, |_| Options {
        tls: Some(tls.clone()),
        ..Options::default()
    })
    .expect("masters");

    let root = tempfile::tempdir().expect("the chroot");
    std::fs::copy(&binary, root.path().join("redlock-operator")).expect("the binary into the chroot");
    std::fs::create_dir(root.path().join("etc")).expect("/etc");
    let names: Vec<String> = (0..cluster.len())
        .map(|i| format!("master-{i}.redlock.test"))
        .collect();
    std::fs::write(
        root.path().join("etc/hosts"),
        format!("127.0.0.1 {}\n", names.join(" ")),
    )
    .expect("/etc/hosts");
    std::fs::copy(&tls.ca_cert, root.path().join("ca.crt")).expect("the CA into the chroot");
    let urls: Vec<String> = cluster
        .servers()
        .iter()
        .zip(&names)
        .map(|(server, name)| server.url().replace("127.0.0.1", name))
        .collect();
    assert!(urls.iter().all(|url| url.starts_with("rediss://")), "{urls:?}");

    // Fresh masters sit out a quarantine of --max-ttl (1s); their reported uptime may be a second ahead.
    std::thread::sleep(Duration::from_millis(3_100));
    let output = in_chroot(root.path())
        .args([
            "/redlock-operator",
            "lock",
            "--redis-ca",
            "/ca.crt",
            "--ttl",
            "1s",
            "--max-ttl",
            "1s",
        ])
        .args(urls.iter().flat_map(|url| ["--redis", url.as_str()]))
        .args(["chroot-key", "--", "/redlock-operator", "--version"])
        // Nothing from this environment, but the PATH that finds `chroot` (or `unshare`).
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(Stdio::null())
        .output()
        .expect("run chroot");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(
        output.status.success(),
        "lock in the chroot failed ({}): {stderr}",
        output.status
    );
    let expected = format!("redlock-operator {}", env!("CARGO_PKG_VERSION"));
    assert!(stdout.contains(&expected), "stdout {stdout:?}, stderr {stderr}");
}

/// `chroot DIR`, as root; through a user namespace of its own otherwise (`unshare -r`), where the kernel allows.
fn in_chroot(root: &Path) -> Command {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    let as_root = std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0);
    let mut command = if as_root {
        Command::new("chroot")
    } else {
        let mut command = Command::new("unshare");
        command.args(["--user", "--map-root-user", "chroot"]);
        command
    };
    command.arg(root);
    command
}
