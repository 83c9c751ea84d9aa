use std::process::ExitCode;

use redlock_operator::cli::{self, Command};
use redlock_operator::telemetry;

// See Cargo.toml: glibc's malloc cost the operator a third of its CPU at scale.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The commit this binary was built from, when the build said (scripts/release.sh, the Dockerfile).
const COMMIT: Option<&str> = option_env!("REDLOCK_COMMIT");

fn main() -> ExitCode {
    // Leaked once: clap keeps the version for the life of the command, which is the process's.
    let version: &'static str = Box::leak(cli::version(COMMIT).into_boxed_str());
    let cli = match cli::parse(version) {
        Ok(cli) => cli,
        Err(code) => return exit(code),
    };
    let runtime = match runtime_for(&cli.command).enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("redlock-operator: cannot start the async runtime: {err}");
            return exit(cli::exit_code::SOFTWARE);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => {
                telemetry::init(cli.log_format, "info");
                cli::run::run(args).await
            }
            Command::Lock(args) => {
                telemetry::init(cli.log_format, "warn");
                cli::lock::run(args).await
            }
            Command::Crd(args) => cli::crd::run(&args),
            Command::CopyBinary(args) => cli::copy_binary::run(&args),
            Command::Elect(args) => {
                telemetry::init(cli.log_format, "warn");
                cli::elect::run(args).await
            }
            Command::Guard(args) => {
                telemetry::init(cli.log_format, "warn");
                cli::guard::run(args).await
            }
        }
    });
    // Background reconnect tasks must not delay the exit.
    runtime.shutdown_background();
    exit(code)
}

/// The `lock` command does one thing at a time (acquire, then supervise one child while one keeper extends):
/// a current-thread runtime starts no worker threads, saves the cross-thread wake-ups issue 16 measured on a
/// quiet machine (the engine benchmark compares both runtimes), and ties the child's parent-death signal to the
/// main thread, which spawns it. The Job guard, one watch and one child, is the same. The operator and `elect`
/// serve many watches and locks at once.
fn runtime_for(command: &Command) -> tokio::runtime::Builder {
    match command {
        Command::Lock(_) | Command::Guard(_) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    }
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
