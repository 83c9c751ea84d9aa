//! Exit statuses of the command-line tool, from sysexits(3) where one fits. Documented in the README.

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
