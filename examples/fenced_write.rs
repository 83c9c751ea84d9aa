//! A holder's fenced write with kube-rs: sets keys of a ConfigMap labelled `redlock.io/fenced-by: <lock>` and the
//! annotation `redlock.io/fencing-token` in one merge patch, so that the chart's fenced-objects policy judges the
//! change by this holder's token ("Fenced objects" in docs/explanation/hand-over-and-fencing.md).
//!
//! ```text
//! fenced_write [--namespace NAMESPACE] CONFIGMAP KEY=VALUE...
//! ```
//!
//! Run it under `redlock-operator lock`, `elect` or the guard. The token is read at each write: from the file
//! `REDLOCK_FENCING_TOKEN_FILE` names when that is set (kept current across grants), else from
//! `REDLOCK_FENCING_TOKEN`. Exits 1 with the API server's message when the write is refused (403: a later holder's
//! token is in force, stop working), 2 on any other failure (no token, no cluster, no such ConfigMap).

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

const TOKEN_ANNOTATION: &str = "redlock.io/fencing-token";
const TOKEN_FILE_ENV: &str = "REDLOCK_FENCING_TOKEN_FILE";
const TOKEN_ENV: &str = "REDLOCK_FENCING_TOKEN";

#[derive(Parser)]
#[command(about = "Writes a fenced ConfigMap's data with this holder's fencing token")]
struct Args {
    /// The ConfigMap's namespace [default: the kubeconfig context's, or the pod's own]
    #[arg(short, long)]
    namespace: Option<String>,
    /// The ConfigMap to write
    config_map: String,
    /// The keys to set
    #[arg(value_name = "KEY=VALUE", required = true, value_parser = key_value)]
    data: Vec<(String, String)>,
}

enum Failure {
    /// The API server refused the write (403): its message names the lock and both tokens.
    Refused(String),
    Other(String),
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match write(&args).await {
        Ok((token, resource_version)) => {
            println!(
                "configmap {} written with fencing token {token} (resourceVersion {resource_version})",
                args.config_map
            );
            ExitCode::SUCCESS
        }
        Err(Failure::Refused(message)) => {
            eprintln!("fenced_write: refused: {message}");
            ExitCode::from(1)
        }
        Err(Failure::Other(message)) => {
            eprintln!("fenced_write: {message}");
            ExitCode::from(2)
        }
    }
}

/// One fenced write; returns the token it was written with and the object's resourceVersion after it.
async fn write(args: &Args) -> Result<(u64, String), Failure> {
    let client = Client::try_default().await.map_err(|error| {
        Failure::Other(format!(
            "no Kubernetes client (in-cluster or kubeconfig): {error}"
        ))
    })?;
    let namespace = args
        .namespace
        .as_deref()
        .unwrap_or(client.default_namespace())
        .to_owned();
    let config_maps: Api<ConfigMap> = Api::namespaced(client, &namespace);
    // Read right before the write, not once at start: a process that outlives one grant must send the current one.
    let token = current_token()?;
    // The change and the token in the same request: a change sent without its token would be judged by the token
    // the object already carries (the last writer's), and a token sent alone would not cover the change.
    let patch = serde_json::json!({
        "metadata": { "annotations": { TOKEN_ANNOTATION: token.to_string() } },
        "data": args.data.iter().cloned().collect::<BTreeMap<_, _>>(),
    });
    match config_maps
        .patch(&args.config_map, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(written) => Ok((token, written.metadata.resource_version.unwrap_or_default())),
        Err(kube::Error::Api(status)) if status.code == 403 => Err(Failure::Refused(status.message)),
        Err(error) => Err(Failure::Other(format!(
            "writing configmap {namespace}/{}: {error}",
            args.config_map
        ))),
    }
}

/// This holder's token now. With `REDLOCK_FENCING_TOKEN_FILE` set, the file alone counts: no file means no grant
/// at this moment (the command it was written for has ended), and the variable may hold an older grant's token.
fn current_token() -> Result<u64, Failure> {
    let (text, source) = match std::env::var_os(TOKEN_FILE_ENV).filter(|path| !path.is_empty()) {
        Some(path) => {
            let text = std::fs::read_to_string(&path).map_err(|error| {
                Failure::Other(format!(
                    "no current grant: {TOKEN_FILE_ENV} names {}, which cannot be read: {error}",
                    path.display()
                ))
            })?;
            (text, TOKEN_FILE_ENV)
        }
        None => {
            let text = std::env::var(TOKEN_ENV).map_err(|_| {
                Failure::Other(format!(
                    "no fencing token ({TOKEN_ENV} or {TOKEN_FILE_ENV}): run this under redlock-operator lock, elect or guard"
                ))
            })?;
            (text, TOKEN_ENV)
        }
    };
    let digits = text.trim();
    // The policy takes only digits; `parse` alone would also take a leading `+`.
    match digits.parse::<u64>() {
        Ok(token) if digits.bytes().all(|byte| byte.is_ascii_digit()) => Ok(token),
        _ => Err(Failure::Other(format!(
            "{source} gives {digits:?}, not a fencing token (decimal digits)"
        ))),
    }
}

fn key_value(argument: &str) -> Result<(String, String), String> {
    argument
        .split_once('=')
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .ok_or_else(|| format!("{argument:?} is not KEY=VALUE"))
}
