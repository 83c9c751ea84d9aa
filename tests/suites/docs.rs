//! The docs: their snippets and links, the generated reference pages and CRDs, the README's local path.
//!
//! One test binary per area, so that the shared support is compiled once for each (issue 57); each former
//! test file is a module of it, and a test's name starts with that module (`jobs::...`).

#[path = "../crds.rs"]
mod crds;
#[path = "../docs.rs"]
mod docs;
#[path = "../readme_local_path.rs"]
mod readme_local_path;
#[path = "../reference_docs.rs"]
mod reference_docs;
#[path = "../support/mod.rs"]
mod support;
