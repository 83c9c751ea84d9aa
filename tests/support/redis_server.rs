//! Real `redis-server` processes for tests, on free loopback ports, with real faults: SIGKILL and restart empty
//! (no persistence), SIGSTOP/SIGCONT, and a clock that runs fast (through the `fastclock.c` preload, built here
//! with the system C compiler; see that file for why not `faketime`).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::{Index, IndexMut};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const READY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The master's clock runs this many times faster than real time (for example 1.5).
    pub clock_rate: Option<f64>,
    pub password: Option<String>,
    /// Serve TLS (on a port of its own) with these files; `url()` then names the TLS port.
    pub tls: Option<TlsFiles>,
    /// More `redis-server` arguments after the harness's own: configuration a test needs at start, such as
    /// `--user` rules.
    pub extra_args: Vec<String>,
}

/// A throw-away CA and a server certificate for 127.0.0.1 (and any name under redlock.test), made with the
/// `openssl` command.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl TlsFiles {
    pub fn generate(dir: &std::path::Path) -> io::Result<Self> {
        let path = |name: &str| dir.join(name);
        let ext = path("san.ext");
        // The names under redlock.test are what a test's own /etc/hosts may give 127.0.0.1 (the static binary's chroot).
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1,DNS:*.redlock.test\nbasicConstraints=CA:FALSE\n",
        )?;
        let steps: [&[&str]; 3] = [
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=redlock-test-ca",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
            ],
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                "/CN=127.0.0.1",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
            ],
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "san.ext",
                "-out",
                "server.crt",
            ],
        ];
        for args in steps {
            let output = Command::new("openssl").args(args).current_dir(dir).output()?;
            if !output.status.success() {
                return Err(io::Error::other(format!(
                    "openssl {}: {}",
                    args[0],
                    String::from_utf8_lossy(&output.stderr)
                )));
            }
        }
        Ok(Self {
            ca_cert: path("ca.crt"),
            server_cert: path("server.crt"),
            server_key: path("server.key"),
        })
    }
}

pub struct RedisServer {
    options: Options,
    port: u16,
    /// The TLS port, when serving TLS; the plain `port` then only serves the readiness check.
    tls_port: Option<u16>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> io::Result<Self> {
        Self::start_with(Options::default())
    }

    pub fn start_with(options: Options) -> io::Result<Self> {
        let mut last_error = None;
        // A port picked by the OS can be taken by someone else before redis binds it: try a few.
        for _ in 0..5 {
            let port = free_port()?;
            let tls_port = match options.tls {
                Some(_) => Some(free_port()?),
                None => None,
            };
            let mut server = Self {
                options: options.clone(),
                port,
                tls_port,
                dir: tempfile::tempdir()?,
                child: None,
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(err) => last_error = Some(err),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("could not start redis-server")))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self) -> String {
        let (scheme, port) = match self.tls_port {
            Some(port) => ("rediss", port),
            None => ("redis", self.port),
        };
        match &self.options.password {
            Some(password) => format!("{scheme}://:{password}@127.0.0.1:{port}"),
            None => format!("{scheme}://127.0.0.1:{port}"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL: the master and everything it held are gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILL if running, then a new, empty master on the same port.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(err) if Instant::now() < deadline => {
                    let _ = err;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// SIGSTOP: the master keeps its connections but answers nothing until [`RedisServer::cont`].
    pub fn stop(&self) {
        self.signal(Signal::SIGSTOP);
    }

    pub fn cont(&self) {
        self.signal(Signal::SIGCONT);
    }

    fn signal(&self, signal: Signal) {
        if let Some(child) = &self.child
            && let Ok(pid) = i32::try_from(child.id())
        {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn spawn(&mut self) -> io::Result<()> {
        let port = self.port.to_string();
        let dir = self.dir.path().to_string_lossy().into_owned();
        let log = self.log_path().to_string_lossy().into_owned();
        let mut args: Vec<String> = [
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            &dir,
            "--logfile",
            &log,
            "--maxmemory-policy",
            "noeviction",
        ]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect();
        if let Some(password) = &self.options.password {
            args.extend(["--requirepass".to_owned(), password.clone()]);
        }
        args.extend(self.options.extra_args.iter().cloned());
        if let (Some(tls), Some(port)) = (&self.options.tls, self.tls_port) {
            let path = |path: &PathBuf| path.to_string_lossy().into_owned();
            args.extend([
                "--tls-port".to_owned(),
                port.to_string(),
                "--tls-cert-file".to_owned(),
                path(&tls.server_cert),
                "--tls-key-file".to_owned(),
                path(&tls.server_key),
                "--tls-ca-cert-file".to_owned(),
                path(&tls.ca_cert),
                "--tls-auth-clients".to_owned(),
                "no".to_owned(),
            ]);
        }
        let mut command = Command::new("redis-server");
        if let Some(rate) = self.options.clock_rate {
            command
                .env("LD_PRELOAD", fastclock_library()?)
                .env("FASTCLOCK_RATE", rate.to_string());
        }
        let child = command
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| io::Error::new(err.kind(), format!("cannot run redis-server: {err}")))?;
        self.child = Some(child);
        match self.wait_ready() {
            Ok(()) => Ok(()),
            Err(err) => {
                self.kill();
                let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
                Err(io::Error::other(format!(
                    "redis-server on port {} did not start: {err}\n{log}",
                    self.port
                )))
            }
        }
    }

    fn wait_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let auth = self
            .options
            .password
            .as_ref()
            .map(|password| format!("*2\r\n$4\r\nAUTH\r\n${}\r\n{password}\r\n", password.len()));
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                return Err(io::Error::other(format!("exited with {status}")));
            }
            if ping(self.addr(), auth.as_deref()).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no PONG within 10s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn ping(addr: SocketAddr, auth: Option<&str>) -> io::Result<()> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut request = auth.unwrap_or_default().to_owned();
    request.push_str("*1\r\n$4\r\nPING\r\n");
    stream.write_all(request.as_bytes())?;
    let mut reply = Vec::new();
    let mut buffer = [0u8; 64];
    while !reply.ends_with(b"+PONG\r\n") {
        let read = stream.read(&mut buffer)?;
        if read == 0 {
            return Err(io::Error::other("connection closed"));
        }
        reply.extend_from_slice(&buffer[..read]);
        // Still loading, or a wrong password: not ready.
        if reply.starts_with(b"-") {
            return Err(io::Error::other(String::from_utf8_lossy(&reply).into_owned()));
        }
    }
    Ok(())
}

/// Builds `fastclock.c` once per test binary, into Cargo's scratch directory for tests.
fn fastclock_library() -> io::Result<PathBuf> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/fastclock.c");
            // Integration tests and benchmarks have Cargo's scratch directory; the stand-in cluster does not.
            let scratch = option_env!("CARGO_TARGET_TMPDIR").map_or_else(std::env::temp_dir, PathBuf::from);
            let output = scratch.join(format!("libfastclock-{}.so", std::process::id()));
            let result = Command::new("cc")
                .args(["-shared", "-fPIC", "-O2", "-o"])
                .arg(&output)
                .arg(&source)
                .output()
                .map_err(|err| format!("cannot run cc: {err}"))?;
            if result.status.success() {
                Ok(output)
            } else {
                Err(format!("cc failed: {}", String::from_utf8_lossy(&result.stderr)))
            }
        })
        .clone()
        .map_err(io::Error::other)
}

pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// N independent masters (no replication, no persistence), as Redlock wants them.
pub struct RedisCluster {
    servers: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start(count: usize) -> io::Result<Self> {
        Self::start_with(count, |_| Options::default())
    }

    /// `options(i)` configures master `i`, for example a fast clock on some of them.
    pub fn start_with(count: usize, options: impl Fn(usize) -> Options) -> io::Result<Self> {
        let servers = (0..count)
            .map(|index| RedisServer::start_with(options(index)))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self { servers })
    }

    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }
}

impl Index<usize> for RedisCluster {
    type Output = RedisServer;

    fn index(&self, index: usize) -> &RedisServer {
        &self.servers[index]
    }
}

impl IndexMut<usize> for RedisCluster {
    fn index_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.servers[index]
    }
}

/// The value of `key` on one master, read directly (no lock logic in between).
pub async fn raw_get(url: &str, key: &str) -> Option<String> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    redis::cmd("GET")
        .arg(key)
        .query_async::<Option<String>>(&mut conn)
        .await
        .ok()?
}

/// Runs one command on one master directly (no lock logic in between), for a test that sets up what a master
/// holds.
pub async fn raw_command(url: &str, args: &[&str]) -> redis::Value {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    let mut command = redis::cmd(args[0]);
    for arg in &args[1..] {
        command.arg(*arg);
    }
    command.query_async(&mut conn).await.expect("command")
}
