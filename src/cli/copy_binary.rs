//! `redlock-operator copy-binary DEST`: puts this very binary at DEST.
//!
//! The chart's admission policies give a holder pod an init container from the operator's image, which has no
//! shell and no `cp`: the binary copies itself into the pod's emptyDir, from where the application's container
//! runs `elect` or the guard around its own command. The copy goes to a temporary file beside DEST and is renamed
//! over it, so a container restarted while an init container runs again never sees half a binary.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use clap::Args;

use super::exit_code;

#[derive(Debug, Args)]
pub struct CopyBinaryArgs {
    /// Where to put the binary (its folder is created when missing); it is made read-only and executable
    /// (mode 0555).
    #[arg(value_name = "DEST")]
    pub dest: PathBuf,
}

pub fn run(args: &CopyBinaryArgs) -> i32 {
    let source = match std::env::current_exe() {
        Ok(source) => source,
        Err(err) => {
            eprintln!("redlock-operator copy-binary: cannot find this binary: {err}");
            return exit_code::SOFTWARE;
        }
    };
    match copy(&source, &args.dest) {
        Ok(bytes) => {
            eprintln!(
                "redlock-operator copy-binary: wrote {} ({bytes} bytes)",
                args.dest.display()
            );
            0
        }
        Err(err) => {
            eprintln!(
                "redlock-operator copy-binary: cannot write {}: {err}",
                args.dest.display()
            );
            exit_code::CANNOT_CREATE
        }
    }
}

fn copy(source: &Path, dest: &Path) -> io::Result<u64> {
    let folder = match dest.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    let Some(name) = dest.file_name() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "DEST names no file"));
    };
    fs::create_dir_all(folder)?;
    let mut temporary = name.to_os_string();
    temporary.push(format!(".{}.partial", std::process::id()));
    let temporary = folder.join(temporary);
    let result = fs::copy(source, &temporary).and_then(|bytes| {
        fs::set_permissions(&temporary, fs::Permissions::from_mode(0o555))?;
        fs::rename(&temporary, dest)?;
        Ok(bytes)
    });
    if result.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_into_a_new_folder_read_only_and_executable() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let source = dir.path().join("source");
        fs::write(&source, b"binary").expect("write the source");
        let dest = dir.path().join("bin/redlock-operator");
        assert_eq!(copy(&source, &dest).expect("copied"), 6);
        assert_eq!(fs::read(&dest).expect("read back"), b"binary");
        let mode = fs::metadata(&dest).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode, 0o555);
        // Again over the read-only copy: an init container that runs twice.
        assert_eq!(copy(&source, &dest).expect("copied again"), 6);
        let leftovers: Vec<_> = fs::read_dir(dest.parent().expect("a folder"))
            .expect("list")
            .filter_map(Result::ok)
            .map(|entry| entry.file_name())
            .collect();
        assert_eq!(leftovers, vec![std::ffi::OsString::from("redlock-operator")]);
    }

    #[test]
    fn a_destination_without_a_file_name_is_refused() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let source = dir.path().join("source");
        fs::write(&source, b"binary").expect("write the source");
        assert!(copy(&source, Path::new("/")).is_err());
    }
}
