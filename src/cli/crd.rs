//! `redlock-operator crd`: the CustomResourceDefinitions, generated from the Rust types.

use std::path::PathBuf;

use clap::Args;

use super::exit_code;
use crate::api::crd_documents;

#[derive(Debug, Args)]
pub struct CrdArgs {
    /// Write one file per CRD into this directory instead of printing them.
    #[arg(long, value_name = "DIR")]
    pub write: Option<PathBuf>,
}

pub fn run(args: &CrdArgs) -> i32 {
    let documents = match crd_documents() {
        Ok(documents) => documents,
        Err(err) => {
            eprintln!("redlock-operator crd: cannot render the CRDs: {err}");
            return exit_code::SOFTWARE;
        }
    };
    match &args.write {
        None => {
            let all: Vec<&str> = documents.iter().map(|(_, yaml)| yaml.as_str()).collect();
            print!("{}", all.join("---\n"));
            0
        }
        Some(dir) => {
            for (name, yaml) in &documents {
                let path = dir.join(name);
                if let Err(err) = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, yaml)) {
                    eprintln!("redlock-operator crd: cannot write {}: {err}", path.display());
                    return exit_code::CANNOT_CREATE;
                }
                eprintln!("wrote {}", path.display());
            }
            0
        }
    }
}
