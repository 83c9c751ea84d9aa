//! Lua scripts, run atomically on each master. Each compares the stored value first, so a client can only ever
//! touch its own lock.

/// KEYS[1] lock key, ARGV[1] our value, ARGV[2] ttl in ms.
/// Returns 1 (extended), 2 (re-created: the key had vanished) or the other holder's value.
pub(crate) const EXTEND: &str = r"
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
elseif current == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX')
  return 2
end
return current
";

/// KEYS[1] lock key, ARGV[1] our value, ARGV[2] ttl in ms. Compare-and-extend only, never re-creating the key:
/// for a holder that cannot confirm it is still entitled to repair (a replica that lost sight of its lease).
/// Returns 1 (extended), 0 (absent) or the other holder's value.
pub(crate) const EXTEND_ONLY: &str = r"
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
elseif current == false then
  return 0
end
return current
";

/// KEYS[1] lock key, ARGV[1] our value. Returns 1 (deleted) or 0 (not ours or absent).
pub(crate) const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";
