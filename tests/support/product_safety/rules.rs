//! The harness's pure rules about names: which holders a name belongs to (a Job, a leader pod), which floor record
//! keeps a holder's tokens, and which nemesis events tell of a forced fault. Apart from the files that watch,
//! create and kill things, so that the check of a history (`checker.rs`) reads nothing that does I/O.

/// Whether `holder` (as the checker names holders: `cluster/name`) is a Job of this harness: every Job lock is
/// named `jobs-…`, and its Jobs after it.
pub fn is_job_holder(holder: &str) -> bool {
    holder
        .split_once('/')
        .is_some_and(|(_, name)| name.starts_with("jobs-"))
}

/// Whether `holder` (as the checker names holders: `cluster/name`) is a leader pod of this harness: every
/// leader-election lock is named `leader-…`, and its pods after it.
pub fn is_leader_holder(holder: &str) -> bool {
    holder
        .split_once('/')
        .is_some_and(|(_, name)| name.starts_with("leader-"))
}

/// The floor record a holder's tokens are kept above: its cluster's (holders are named `cluster/…`); the `lock`
/// command (`outside/…`) keeps none.
pub fn floor_of(holder: &str) -> Option<&str> {
    let domain = holder.split('/').next().unwrap_or_default();
    (domain != "outside").then_some(domain)
}

/// What a forced fault's nemesis event starts with: the report lists these.
pub const FORCED: &str = "forced: ";

/// The forced fault a nemesis event tells of (its text after [`FORCED`]), if it tells of one.
pub fn forced_fault(what: &str) -> Option<&str> {
    what.strip_prefix(FORCED)
}
