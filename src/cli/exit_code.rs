//! Exit statuses of the command-line tool, from sysexits(3) where one fits. Documented in docs/reference/cli.md (generated from `MEANINGS`).

/// Bad usage: unknown flag, bad URL, ttl 0, ttl above max-ttl, no masters.
pub const USAGE: i32 = 64;
/// Too few masters reachable (down, timing out or quarantined) to form a majority.
pub const UNAVAILABLE: i32 = 69;
/// An unexpected internal failure (for example the OS random generator failing).
pub const SOFTWARE: i32 = 70;
/// An output file could not be written.
pub const CANNOT_CREATE: i32 = 73;
/// The lock could not be acquired within `--wait`: another holder has it.
pub const TEMPFAIL: i32 = 75;
/// The lock was lost while the command ran; the command was stopped (SIGTERM, then SIGKILL) before the
/// lock's validity ended.
pub const LOCK_LOST: i32 = 76;
/// The command could not be run: not executable.
pub const CANNOT_EXECUTE: i32 = 126;
/// The command could not be run: not found.
pub const NOT_FOUND: i32 = 127;

/// Every exit status the tool gives of its own, with what it means: the reference (docs/reference/cli.md) is
/// generated from this table. A supervised command's own status (and 128 + N when a signal N ended it) is passed
/// through as it is.
pub const MEANINGS: [(i32, &str); 9] = [
    (0, "Success; `elect` after SIGTERM or SIGINT while not leading"),
    (
        USAGE,
        "Bad usage: an unknown flag, a bad URL or duration, ttl 0, ttl above max-ttl, no masters",
    ),
    (
        UNAVAILABLE,
        "Too few masters reachable (down, timing out or quarantined) to form a majority; no Kubernetes configuration (`elect`, `guard`, `run`)",
    ),
    (
        SOFTWARE,
        "An unexpected internal failure (the OS random generator failing, a watch that ended)",
    ),
    (
        CANNOT_CREATE,
        "An output file could not be written (`crd --write`)",
    ),
    (
        TEMPFAIL,
        "`lock`: the lock could not be acquired within --wait; another holder has it",
    ),
    (
        LOCK_LOST,
        "The lock or grant was lost while the command ran, and the command was stopped (SIGTERM, then SIGKILL) before the validity ended; `guard`: also when the pod was stopped before its grant was current",
    ),
    (CANNOT_EXECUTE, "The command could not be run: not executable"),
    (NOT_FOUND, "The command could not be run: not found"),
];
