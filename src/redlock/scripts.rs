//! Lua scripts, run atomically on each master. Each compares the stored value first, so a client can only ever
//! touch its own lock.
//!
//! Fencing counters are decimal strings compared as strings (length, then digits): Lua numbers are doubles,
//! which cannot hold every 64-bit integer, so `tonumber` would round a large counter and let a token repeat.

use std::sync::LazyLock;

/// Shared by the scripts that read a counter: `canonical(s)` strips leading zeros (nil if `s` is not all
/// digits), `not_below(a, b)` is `a >= b` for canonical decimals, `raise` sets the counter to at least `token`
/// and refreshes its expiry.
const COUNTER_FUNCTIONS: &str = r"
local function canonical(s)
  if not string.match(s, '^%d+$') then return nil end
  local stripped = string.gsub(s, '^0+', '')
  if stripped == '' then return '0' end
  return stripped
end
local function not_below(a, b)
  if #a ~= #b then return #a > #b end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return true
end
local function raise(key, token, retention)
  local counter = redis.call('GET', key)
  local current = counter and canonical(counter)
  if token ~= '0' and (not counter or (current and not not_below(current, token))) then
    redis.call('SET', key, token, 'PX', retention)
  elseif counter then
    redis.call('PEXPIRE', key, retention)
  end
end
";

/// KEYS[1] lock key, KEYS[2] its fencing counter; ARGV[1] our value, ARGV[2] ttl in ms, ARGV[3] the proposed
/// token, ARGV[4] the counter's retention in ms.
/// Returns {1} (granted: the key holds our value and the counter is the proposal), {0, counter} (refused: the
/// counter is not below the proposal; nothing written) or {2, value} (held by another value).
/// A key that already holds our value (set by an earlier, refused round of the same attempt) is granted again.
fn acquire() -> String {
    format!(
        "{COUNTER_FUNCTIONS}{}",
        r"
local counter = redis.call('GET', KEYS[2])
if counter then
  local current = canonical(counter)
  if not current then
    return redis.error_reply('fencing counter ' .. KEYS[2] .. ' is not a non-negative integer')
  end
  if not_below(current, ARGV[3]) then return {0, current} end
end
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return {2, held} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
return {1}
"
    )
}

/// KEYS[1] lock key, KEYS[2] its fencing counter; ARGV[1] our value, ARGV[2] ttl in ms, ARGV[3] our token
/// ('0' when unknown), ARGV[4] the counter's retention in ms.
/// Returns 1 (extended), 2 (re-created: the key had vanished) or the other holder's value. Where it extends or
/// re-creates, the counter is raised to our token (a master that lost it learns it back) and kept.
fn extend() -> String {
    format!(
        "{COUNTER_FUNCTIONS}{}",
        r"
local current = redis.call('GET', KEYS[1])
local result
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  result = 1
elseif current == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX')
  result = 2
else
  return current
end
raise(KEYS[2], ARGV[3], ARGV[4])
return result
"
    )
}

/// KEYS[1] lock key, KEYS[2] its fencing counter; ARGV as for [`extend`]. Compare-and-extend only, never
/// re-creating the key: for a holder that cannot confirm it is still entitled to repair (a replica that lost
/// sight of its lease). Returns 1 (extended), 0 (absent) or the other holder's value; where it extends, the
/// counter is raised and kept as by [`extend`].
fn extend_only() -> String {
    format!(
        "{COUNTER_FUNCTIONS}{}",
        r"
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  raise(KEYS[2], ARGV[3], ARGV[4])
  return 1
elseif current == false then
  return 0
end
return current
"
    )
}

/// KEYS[1] lock key, ARGV[1] our value. Returns 1 (deleted) or 0 (not ours or absent). The fencing counter
/// stays: the next holder's token must be higher.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

pub(crate) static ACQUIRE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&acquire()));
pub(crate) static EXTEND: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&extend()));
pub(crate) static EXTEND_ONLY: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&extend_only()));
pub(crate) static RELEASE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RELEASE));

/// Every script, for loading them on a new connection.
pub(crate) fn all() -> [&'static redis::Script; 4] {
    [&*ACQUIRE, &*EXTEND, &*EXTEND_ONLY, &*RELEASE_SCRIPT]
}

/// The key of `key`'s fencing counter, in the same Redis Cluster hash slot (should the masters be clusters): a
/// key that has a hash tag keeps it (`a{b}` → `a{b}:token`), any other is wrapped in one (`orders` →
/// `{orders}:token`; a key with a `}` but no tag may then land elsewhere, which independent masters, as
/// Redlock wants them, never notice).
pub fn counter_key(key: &str) -> String {
    let has_tag = key
        .find('{')
        .is_some_and(|open| key[open + 1..].find('}').is_some_and(|close| close > 0));
    if has_tag {
        format!("{key}:token")
    } else {
        format!("{{{key}}}:token")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_keys_share_the_hash_slot_of_their_lock() {
        assert_eq!(counter_key("orders"), "{orders}:token");
        assert_eq!(counter_key("ns/{tenant}/orders"), "ns/{tenant}/orders:token");
        // `{}` is no hash tag (the whole key is hashed), so the key is wrapped.
        assert_eq!(counter_key("a{}b"), "{a{}b}:token");
    }
}
