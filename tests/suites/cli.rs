//! The `lock` command and the image: the CLI against real masters, the static binary, the image archive and the
//! release script.
//!
//! One test binary per area, so that the shared support is compiled once for each (issue 57); each former
//! test file is a module of it, and a test's name starts with that module (`jobs::...`).

#[path = "../image.rs"]
mod image;
#[path = "../lock_cli.rs"]
mod lock_cli;
#[path = "../support/mod.rs"]
mod support;
