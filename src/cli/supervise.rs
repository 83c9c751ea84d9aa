//! Runs the locked command in its own process group and stops the whole group when the lock is lost.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use super::exit_code;

pub(crate) struct Child {
    child: tokio::process::Child,
    group: Pid,
    /// The token file written for this command's grant, removed when the command is done with.
    _token_file: Option<TokenFile>,
}

/// Names a file where `elect`, `guard` and `lock` keep the current grant's fencing token: rewritten atomically
/// (a new file renamed over it) before each command they start under a new grant, removed once that command has
/// ended. For processes that outlive one grant (and re-read it before each write); the command itself gets it in
/// `REDLOCK_FENCING_TOKEN` too.
pub(crate) const TOKEN_FILE_ENV: &str = "REDLOCK_FENCING_TOKEN_FILE";

/// The token file of a running command's grant.
struct TokenFile(std::path::PathBuf);

impl TokenFile {
    /// Writes `token` (digits only, no newline) where `REDLOCK_FENCING_TOKEN_FILE` says, if it says.
    fn write(token: &str) -> Result<Option<TokenFile>, (i32, String)> {
        let Some(path) = std::env::var_os(TOKEN_FILE_ENV).filter(|path| !path.is_empty()) else {
            return Ok(None);
        };
        let path = std::path::PathBuf::from(path);
        let mut temporary = path.clone().into_os_string();
        temporary.push(format!(".{}.tmp", std::process::id()));
        let written = std::fs::write(&temporary, token).and_then(|()| std::fs::rename(&temporary, &path));
        if let Err(err) = written {
            let _ = std::fs::remove_file(&temporary);
            let message = format!("cannot write the fencing token to {}: {err}", path.display());
            return Err((exit_code::CANNOT_CREATE, message));
        }
        Ok(Some(TokenFile(path)))
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub(crate) enum Ended {
    /// The command ended by itself; its shell-style exit status.
    Exited(i32),
    /// The command ended after a SIGTERM or SIGINT sent to us was passed on (the pod is being stopped); its
    /// shell-style exit status.
    Signalled(i32),
    /// The lock was lost and the command was stopped.
    StoppedOnLoss,
}

impl Child {
    pub(crate) fn spawn(command: &[OsString], env: &[(&str, String)]) -> Result<Self, (i32, String)> {
        let Some((program, args)) = command.split_first() else {
            return Err((exit_code::USAGE, "no command given after --".into()));
        };
        let token = env.iter().find(|(key, _)| *key == "REDLOCK_FENCING_TOKEN");
        let token_file = match token {
            Some((_, token)) => TokenFile::write(token)?,
            None => None,
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            // The masters' URLs may carry passwords: the command gets the lock, not the credentials to forge it.
            .env_remove("REDLOCK_REDIS")
            .envs(env.iter().map(|(key, value)| (*key, value.as_str())))
            .stdin(Stdio::inherit())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            // Its own group, so that SIGTERM/SIGKILL on loss reach every process it started.
            .process_group(0)
            .kill_on_drop(true);
        let supervisor = nix::unistd::getpid();
        // SAFETY: runs in the child between fork and exec, where only async-signal-safe calls are allowed:
        // prctl(2) and getppid(2) are, and nothing is allocated.
        unsafe {
            cmd.pre_exec(move || {
                // If we die, even of SIGKILL, the command dies too: it must never go on acting on a lock nobody
                // watches. (Its own children are reached by the group signals on loss, not by this.)
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
                if nix::unistd::getppid() != supervisor {
                    // We died before the line above took effect.
                    return Err(std::io::Error::other("the supervisor exited"));
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|err| {
            let name = program.to_string_lossy();
            match err.kind() {
                ErrorKind::NotFound => (exit_code::NOT_FOUND, format!("{name}: command not found")),
                ErrorKind::PermissionDenied => {
                    (exit_code::CANNOT_EXECUTE, format!("{name}: permission denied"))
                }
                _ => (exit_code::CANNOT_EXECUTE, format!("{name}: {err}")),
            }
        })?;
        let pid = child.id().and_then(|id| i32::try_from(id).ok()).ok_or((
            exit_code::SOFTWARE,
            "the command exited before it could be supervised".to_owned(),
        ))?;
        Ok(Self {
            child,
            group: Pid::from_raw(pid),
            _token_file: token_file,
        })
    }

    /// Waits for the command. SIGINT, SIGTERM and SIGHUP sent to us are passed on to its group; when `lost`
    /// fires, the group gets SIGTERM, then SIGKILL after `grace`.
    pub(crate) async fn supervise(&mut self, lost: CancellationToken, grace: Duration) -> Ended {
        let mut forwarded = Forwarded::install();
        let mut stopping = false;
        loop {
            tokio::select! {
                status = self.child.wait() => {
                    let code = status.map_or(exit_code::SOFTWARE, shell_status);
                    return if stopping { Ended::Signalled(code) } else { Ended::Exited(code) };
                }
                () = lost.cancelled() => {
                    self.stop(grace).await;
                    return Ended::StoppedOnLoss;
                }
                Some(sig) = forwarded.next() => {
                    stopping |= matches!(sig, Signal::SIGTERM | Signal::SIGINT);
                    self.signal(sig);
                }
            }
        }
    }

    async fn stop(&mut self, grace: Duration) {
        self.signal(Signal::SIGTERM);
        if tokio::time::timeout(grace, self.child.wait()).await.is_err() {
            self.signal(Signal::SIGKILL);
            let _ = self.child.wait().await;
        }
        // Processes of the group that outlived its leader must not go on acting on a lost lock either.
        let _ = killpg(self.group, Signal::SIGKILL);
    }

    fn signal(&self, sig: Signal) {
        if let Err(err) = killpg(self.group, sig) {
            tracing::debug!(%err, ?sig, "could not signal the command's process group");
        }
    }
}

/// The exit status a shell would report: the code, or 128 + the signal that ended the process.
fn shell_status(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|sig| 128 + sig))
        .unwrap_or(exit_code::SOFTWARE)
}

/// Signals to pass on to the command; if a handler cannot be installed that signal keeps its default action.
struct Forwarded {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Forwarded {
    fn install() -> Self {
        let kinds = [
            (Signal::SIGINT, SignalKind::interrupt()),
            (Signal::SIGTERM, SignalKind::terminate()),
            (Signal::SIGHUP, SignalKind::hangup()),
        ];
        let streams = kinds
            .into_iter()
            .filter_map(|(sig, kind)| signal(kind).ok().map(|stream| (sig, stream)))
            .collect();
        Self { streams }
    }

    async fn next(&mut self) -> Option<Signal> {
        if self.streams.is_empty() {
            return std::future::pending().await;
        }
        let waits = self
            .streams
            .iter_mut()
            .map(|(sig, stream)| Box::pin(async move { stream.recv().await.map(|()| *sig) }));
        futures::future::select_all(waits).await.0
    }
}
