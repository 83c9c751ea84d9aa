use std::process::ExitCode;

use redlock_operator::cli::{self, Command};
use redlock_operator::telemetry;

fn main() -> ExitCode {
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(code) => return exit(code),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
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
            Command::Elect(args) => {
                telemetry::init(cli.log_format, "warn");
                cli::elect::run(args).await
            }
        }
    });
    // Background reconnect tasks must not delay the exit.
    runtime.shutdown_background();
    exit(code)
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
