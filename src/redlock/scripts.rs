//! Lua scripts, run atomically on each master. Each compares the stored value first, so a client can only ever
//! touch its own lock.
//!
//! Fencing counters are decimal strings. Lua numbers are doubles, exact only up to 2^53: counters of up to 15
//! digits are compared as numbers (the fast path every real counter takes), longer ones as strings (length,
//! then digits), so that no large counter is rounded and lets a token repeat.
//!
//! The scripts are cut for the fewest `redis.call`s on the path every acquisition and extension takes: on Redis
//! 7 and later, `SET NX PX GET` checks and sets the lock key in one call and `SET PX GET` sets the counter and
//! returns the old one; a refusal (rare: the caller is told the counter and proposes above it at once) puts
//! back what it overwrote. Older masters (no `redis.REDIS_VERSION_NUM`, no `SET NX GET`) take the same
//! decisions with a read before each write.

use std::sync::LazyLock;

/// Whether the master is Redis 7 or later (`SET NX GET`); tests substitute [`LEGACY`] to run the other branch
/// on a Redis 7 master.
const MODERN: &str = "local MODERN = redis.REDIS_VERSION_NUM ~= nil\n";
const LEGACY: &str = "local MODERN = false\n";

/// `below(c, t)`: the counter `c` (as stored: anything) is a decimal below the token `t` (canonical). A counter
/// that is not all digits is never below: nothing is granted over it.
const BELOW: &str = r"
local function below(c, t)
  if not string.find(c, '^%d+$') then return false end
  if #c < 16 and #t < 16 then return tonumber(c) < tonumber(t) end
  c = string.gsub(c, '^0+', '')
  if #c ~= #t then return #c < #t end
  for i = 1, #c do
    local x, y = string.byte(c, i), string.byte(t, i)
    if x ~= y then return x < y end
  end
  return false
end
-- known(key, t): the counter at `key` when it is a decimal not below the token `t`, else false. Every refusal
-- reports it, so that a master that forgot its counter (restarted empty) cannot grant a token below one a
-- refusing master knows: the caller proposes above it, as after a refusal for the counter itself.
local function known(key, t)
  local c = redis.call('GET', key)
  if c and string.find(c, '^%d+$') and not below(c, t) then return c end
  return false
end
";

/// `raise(key, token, retention)`: the counter becomes `token` where it is below it (or absent), and is kept
/// for `retention` ms either way; token '0' (unknown) only keeps it. One call when the counter already is
/// `token`, the path of every extension.
const RAISE: &str = r"
local function raise(key, token, retention)
  if token == '0' then
    redis.call('PEXPIRE', key, retention)
    return
  end
  local old
  if MODERN then
    old = redis.call('SET', key, token, 'PX', retention, 'GET')
    if old and old ~= token and not below(old, token) then
      redis.call('SET', key, old, 'PX', retention)
    end
  else
    old = redis.call('GET', key)
    if old and not below(old, token) then
      redis.call('PEXPIRE', key, retention)
    else
      redis.call('SET', key, token, 'PX', retention)
    end
  end
end
";

/// `queue_refusal(queue, deadlines, waiter, ticket, keep, state)`: the fair queue of a key (or of a semaphore's
/// permits), run before [`acquire`] or [`acquire_any`] decides: `queue` maps waiter → ticket, `deadlines` waiter
/// → this master's clock in ms; `waiter` is '' for a caller that does not wait, `ticket` '0' before it has one,
/// `keep` how long it stays queued without asking again, in ms; `state()` says how many grants this master could
/// make now (1 or 0 for a key, the free permits of a semaphore) and the holder's value to report.
///
/// Waiters whose deadline passed are dropped first. A waiter joins when the queue is not empty, when it already
/// has a ticket, or when the key is held by another. A new waiter takes the ticket above the last queued; one
/// that brings a ticket (the highest its masters gave it) keeps the higher of that and this master's, so that a
/// master that restarted empty or dropped it while cut off queues it where the others do. The queue is ordered by
/// ticket, then by waiter (a sorted set's own order, the same on every master). Only the first `free` waiters (the
/// queue's head, for a key), or anyone when the queue is empty, go on to the decision. Anyone else is answered
/// {3, place, holder's value or false, ticket}: place counts from 1 (for a caller that does not wait, the queue's
/// length plus one) and ticket is '0' for such a caller. Nothing here touches the key or its counter: the queue
/// only ever refuses. Both keys expire with the last waiter's deadline.
///
/// `leave_granted(queue, deadlines, waiter, ticket)`, once a master granted: a waiter that came without a ticket
/// leaves the queue with the grant (it cannot tell whether this call queued it). One that brings a ticket stays
/// until it leaves on its own, once the whole attempt is won: an attempt that a majority does not grant, or that
/// a later round loses, must not cost it its place on the masters that granted it, or a waiter behind it would be
/// head there meanwhile (found through the `lock` command with one master restarted and another stopped).
const QUEUE: &str = r"
local function master_now()
  -- Writes after TIME need effects replication, the only kind from Redis 7 on (and the default from 5).
  if redis.replicate_commands then redis.replicate_commands() end
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
local function queue_refusal(queue, deadlines, waiter, ticket, keep, state)
  local now
  local occupied = redis.call('EXISTS', queue) == 1
  if occupied then
    now = master_now()
    local dead = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now)
    for i = 1, #dead, 1000 do
      local batch = {unpack(dead, i, math.min(i + 999, #dead))}
      redis.call('ZREM', queue, unpack(batch))
      redis.call('ZREM', deadlines, unpack(batch))
    end
    occupied = redis.call('EXISTS', queue) == 1
  end
  if waiter == '' then
    if not occupied then return nil end
    local _, holder = state()
    return {3, redis.call('ZCARD', queue) + 1, holder or false, '0'}
  end
  local free, holder = state()
  if not occupied and ticket == '0' and free > 0 then return nil end
  local mine = redis.call('ZSCORE', queue, waiter)
  local wanted = tonumber(ticket)
  if mine then
    wanted = math.max(wanted, tonumber(mine))
  elseif wanted == 0 then
    local last = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')
    wanted = tonumber(last[2] or 0) + 1
  end
  now = now or master_now()
  redis.call('ZADD', queue, wanted, waiter)
  redis.call('ZADD', deadlines, now + tonumber(keep), waiter)
  local last_deadline = redis.call('ZRANGE', deadlines, -1, -1, 'WITHSCORES')[2]
  redis.call('PEXPIREAT', queue, last_deadline)
  redis.call('PEXPIREAT', deadlines, last_deadline)
  local place = redis.call('ZRANK', queue, waiter) + 1
  if place > free then
    return {3, place, holder or false, string.format('%d', wanted)}
  end
  return nil
end
local function leave_granted(queue, deadlines, waiter, ticket)
  if queue ~= nil and waiter ~= '' and ticket == '0' then
    redis.call('ZREM', queue, waiter)
    redis.call('ZREM', deadlines, waiter)
  end
end
";

/// KEYS[1] lock key, KEYS[2] its fencing counter; ARGV[1] our value, ARGV[2] ttl in ms, ARGV[3] the proposed
/// token, ARGV[4] the counter's retention in ms; KEYS[3..4] and ARGV[5..7] the key's fair queue, when given (see
/// [`QUEUE`]).
/// Returns 1 (granted: the key holds our value and the counter is the proposal), {0, counter} (refused: the
/// counter is not below the proposal; nothing changed but the counter's retention), {2, value, counter} (held
/// by another value; nothing changed) or the queue's {3, place, holder, ticket, counter}; `counter` in the last
/// two is the key's counter where it is not below the proposal, else false (see `known`). A key that already
/// holds our value (set by an earlier, refused round of the same attempt) is granted again, its expiry
/// unchanged (the attempt's validity counts from its first round). Two calls on Redis 7 when granted.
fn acquire(version: &str) -> String {
    format!(
        "{version}{BELOW}{QUEUE}{}",
        r"
local function key_state()
  local held = redis.call('GET', KEYS[1])
  if not held or held == ARGV[1] then return 1, held end
  return 0, held
end
if KEYS[3] then
  local queued = queue_refusal(KEYS[3], KEYS[4], ARGV[5], ARGV[6], ARGV[7], key_state)
  if queued then
    queued[5] = known(KEYS[2], ARGV[3])
    return queued
  end
end
local held
if MODERN then
  held = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
else
  held = redis.call('GET', KEYS[1])
  if not held then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
end
if held and held ~= ARGV[1] then return {2, held, known(KEYS[2], ARGV[3])} end
local counter
if MODERN then
  counter = redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4], 'GET')
else
  counter = redis.call('GET', KEYS[2])
  if not counter or below(counter, ARGV[3]) then redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4]) end
end
if counter and not below(counter, ARGV[3]) then
  redis.call('SET', KEYS[2], counter, 'PX', ARGV[4])
  if not held then redis.call('DEL', KEYS[1]) end
  if not string.find(counter, '^%d+$') then
    return redis.error_reply('ERR fencing counter ' .. KEYS[2] .. ' is not a non-negative integer')
  end
  return {0, counter}
end
leave_granted(KEYS[3], KEYS[4], ARGV[5], ARGV[6])
return 1
"
    )
}

/// One of several permits (a counting semaphore): KEYS[1..2] the semaphore's fair queue and its deadlines (see
/// [`QUEUE`]; a waiter is let through while its place is within the free permits), then pairs (permit key, its
/// fencing counter) in the order the client tries them; ARGV[1] our value, ARGV[2] ttl in ms, ARGV[3] the
/// counters' retention in ms, ARGV[4..6] the waiter, its ticket and how long it is kept, ARGV[7..] the token
/// proposed for each pair. Takes the first permit that is free or already ours, as [`acquire`] takes
/// its one key, and stops there. Returns {1, i} (granted permit pair i, 1-based), {0, i, counter} (permit i's
/// counter is not below its proposal; nothing changed but the counter's retention), {2, value, counters} (every
/// permit held by another; the first one's value) or the queue's {3, place, holder, ticket, counters};
/// `counters` is {i, counter, ...} for the permits whose counters are not below their proposals (see `known`).
/// A permit that already holds our value at our very token (granted by an earlier round of the same attempt,
/// whose proposal for it did not rise since) is granted again: the counter is ours, not a higher token. Masters in the same state take the same permit, so one round trip
/// decides as for a single key; the client settles any disagreement.
fn acquire_any(version: &str) -> String {
    format!(
        "{version}{BELOW}{QUEUE}{}",
        r"
local pairs_count = (#KEYS - 2) / 2
local function permits_state()
  local free, holder = 0, nil
  for i = 1, pairs_count do
    local held = redis.call('GET', KEYS[2 * i + 1])
    if not held or held == ARGV[1] then
      free = free + 1
    else
      holder = holder or held
    end
  end
  return free, holder
end
-- The counters of candidates that are not below their proposals, as {i, counter, ...}, for a refusal.
local function known_counters()
  local counters = {}
  for i = 1, pairs_count do
    local counter = known(KEYS[2 * i + 2], ARGV[6 + i])
    if counter then
      counters[#counters + 1] = i
      counters[#counters + 1] = counter
    end
  end
  return counters
end
local queued = queue_refusal(KEYS[1], KEYS[2], ARGV[4], ARGV[5], ARGV[6], permits_state)
if queued then
  queued[5] = known_counters()
  return queued
end
local first
for i = 1, pairs_count do
  local key, counter_key, token = KEYS[2 * i + 1], KEYS[2 * i + 2], ARGV[6 + i]
  local held
  if MODERN then
    held = redis.call('SET', key, ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
  else
    held = redis.call('GET', key)
    if not held then redis.call('SET', key, ARGV[1], 'PX', ARGV[2]) end
  end
  if not held or held == ARGV[1] then
    local counter
    if MODERN then
      counter = redis.call('SET', counter_key, token, 'PX', ARGV[3], 'GET')
    else
      counter = redis.call('GET', counter_key)
      if not counter or below(counter, token) then redis.call('SET', counter_key, token, 'PX', ARGV[3]) end
    end
    if counter and not below(counter, token) and not (held == ARGV[1] and counter == token) then
      redis.call('SET', counter_key, counter, 'PX', ARGV[3])
      if not held then redis.call('DEL', key) end
      if not string.find(counter, '^%d+$') then
        return redis.error_reply('ERR fencing counter ' .. counter_key .. ' is not a non-negative integer')
      end
      return {0, i, counter}
    end
    leave_granted(KEYS[1], KEYS[2], ARGV[4], ARGV[5])
    return {1, i}
  end
  first = first or held
end
return {2, first, known_counters()}
"
    )
}

/// KEYS[1] lock key, KEYS[2] its fencing counter; ARGV[1] our value, ARGV[2] ttl in ms, ARGV[3] our token
/// ('0' when unknown), ARGV[4] the counter's retention in ms.
/// Returns 1 (extended), 2 (re-created: the key had vanished), 0 (vanished and not re-created: this master has
/// granted a newer token since) or the other holder's value. Where it re-creates the key, the counter is raised
/// to our token (a master that lost the key lost the counter too, and learns it back). It never re-creates the
/// key over a counter above our token: an extension held up in the network and run after the lock was lost,
/// taken by a newer holder and released again, would otherwise bring the old holder's value back, and a
/// takeover could then resume the old token after a newer one was granted (found by the product safety
/// checker). A plain extension leaves the counter alone: the grant set it on this master, and the keeper's
/// thousands of extensions a second cost the masters no more than without tokens.
fn extend(version: &str) -> String {
    format!(
        "{version}{BELOW}{RAISE}{}",
        r"
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
elseif current == false then
  if ARGV[3] ~= '0' then
    local counter = redis.call('GET', KEYS[2])
    if counter and string.find(counter, '^%d+$') and below(ARGV[3], counter) then return 0 end
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX')
  raise(KEYS[2], ARGV[3], ARGV[4])
  return 2
end
return current
"
    )
}

/// KEYS[1] lock key, KEYS[2] its fencing counter (untouched); ARGV as for [`extend`]. Compare-and-extend
/// only, never re-creating the key: for a holder that cannot confirm it is still entitled to repair (a replica
/// that lost sight of its lease). Returns 1 (extended), 0 (absent) or the other holder's value.
const EXTEND_ONLY: &str = r"
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
elseif current == false then
  return 0
end
return current
";

/// KEYS[1] lock key, ARGV[1] our value, ARGV[2] the key's wake channel ([`released_channel`]; absent or '' for
/// none). Returns 1 (deleted) or 0 (not ours or absent). The fencing counter stays: the next holder's token must
/// be higher. A delete is announced on the channel (one `PUBLISH`, costing nothing when nobody listens), so that
/// the key's waiters ask at once; nothing deleted, nothing announced (an attempt undone where the queue had
/// refused it wakes nobody).
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local deleted = redis.call('DEL', KEYS[1])
  if ARGV[2] and ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], '') end
  return deleted
end
return 0
";

pub(crate) static ACQUIRE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&acquire(MODERN)));
pub(crate) static EXTEND: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&extend(MODERN)));
pub(crate) static EXTEND_ONLY_SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(EXTEND_ONLY));

/// The acquire and extend scripts as a master before Redis 7 runs them, for tests on a Redis 7 master.
pub(crate) fn legacy_scripts() -> (redis::Script, redis::Script) {
    (
        redis::Script::new(&acquire(LEGACY)),
        redis::Script::new(&extend(LEGACY)),
    )
}
pub(crate) static RELEASE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RELEASE));
pub(crate) static ACQUIRE_ANY: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&acquire_any(MODERN)));

/// KEYS the permit keys, ARGV[1] our value, ARGV[2] the semaphore's wake channel ('' for none). Deletes each
/// key that holds our value; returns how many, announced on the channel as [`RELEASE`] does. What an attempt on
/// several permits leaves behind where it did not win: the counters stay, as for [`RELEASE`].
const RELEASE_ANY: &str = r"
local deleted = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    deleted = deleted + redis.call('DEL', key)
  end
end
if deleted > 0 and ARGV[2] and ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], '') end
return deleted
";
pub(crate) static RELEASE_ANY_SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(RELEASE_ANY));

/// KEYS[1] a key's fair queue, KEYS[2] its waiters' deadlines; ARGV[1] the waiter, ARGV[2] how many places at
/// the queue's head let a waiter through (absent or 0: none whose leave matters), ARGV[3] the key's wake channel.
/// Returns 1: the waiter is not queued any more (it got the key, or gave up). A waiter that leaves from one of
/// those places is announced on the channel, as a release is: the one behind it may now be let through.
const LEAVE_QUEUE: &str = r"
local wake = tonumber(ARGV[2] or '0') or 0
if wake > 0 and ARGV[3] and ARGV[3] ~= '' then
  local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
  if rank and rank < wake then redis.call('PUBLISH', ARGV[3], '') end
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
";
pub(crate) static LEAVE_QUEUE_SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(LEAVE_QUEUE));

/// Every script, for loading them on a new connection.
pub(crate) fn all() -> [&'static redis::Script; 7] {
    [
        &*LEAVE_QUEUE_SCRIPT,
        &*ACQUIRE,
        &*EXTEND,
        &*EXTEND_ONLY_SCRIPT,
        &*RELEASE_SCRIPT,
        &*ACQUIRE_ANY,
        &*RELEASE_ANY_SCRIPT,
    ]
}

/// The largest number of permits of one semaphore (`permits` of a lock, `lock --permits`).
pub const MAX_PERMITS: u32 = 100;

/// The Redis key of permit `permit` of the semaphore on `key`. Permit 0 is `key` itself, so a lock of one
/// permit is exactly a lock. Permit i ≥ 1 is `permit:<i>:<key>`: no namespaced key (`<namespace>/…`, a DNS
/// label before the first `/`) and no shared key (a `sharedKeys.prefix` may not start with `permit:`) can
/// equal it, nor can the permit key of another key or another number (the number is the only digits between
/// the two first colons).
pub fn permit_key(key: &str, permit: u32) -> String {
    if permit == 0 {
        key.to_owned()
    } else {
        format!("{PERMIT_KEY_PREFIX}{permit}:{key}")
    }
}

/// What every permit key but permit 0's begins with.
pub const PERMIT_KEY_PREFIX: &str = "permit:";

/// The key of `key`'s fencing counter, in the same Redis Cluster hash slot (should the masters be clusters): a
/// key that has a hash tag keeps it (`a{b}` → `a{b}:token`), any other is wrapped in one (`orders` →
/// `{orders}:token`; a key with a `}` but no tag may then land elsewhere, which independent masters, as
/// Redlock wants them, never notice).
pub fn counter_key(key: &str) -> String {
    beside(key, "token")
}

/// The keys of `key`'s fair queue (waiter → ticket) and of its waiters' deadlines, in the key's hash slot as its
/// counter is.
pub fn queue_keys(key: &str) -> (String, String) {
    (beside(key, "queue"), beside(key, "waiting"))
}

/// The channel on which the masters announce that `key` (a lock's key, a semaphore's, or one of its permits')
/// was released, or that a waiter left the head of its queue: the semaphore's key's for a permit
/// (`permit:<i>:<key>` → `<key>`'s), so that a semaphore's waiters hear of every permit; `{key}:released` (see
/// [`counter_key`] for the braces). A lock key that happens to look like a permit's shares its channel with
/// that semaphore: its waiters and releases use the same name, and the other's only cost an attempt.
pub fn released_channel(key: &str) -> String {
    let base = key
        .strip_prefix(PERMIT_KEY_PREFIX)
        .and_then(|rest| rest.split_once(':'))
        .filter(|(number, _)| !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()))
        .map_or(key, |(_, base)| base);
    beside(base, "released")
}

/// `key`'s companion `suffix` in the same Redis Cluster hash slot (see [`counter_key`]).
fn beside(key: &str, suffix: &str) -> String {
    let has_tag = key
        .find('{')
        .is_some_and(|open| key[open + 1..].find('}').is_some_and(|close| close > 0));
    if has_tag {
        format!("{key}:{suffix}")
    } else {
        format!("{{{key}}}:{suffix}")
    }
}

/// A duration in whole milliseconds, as the scripts take TTLs and the counters' retention.
pub(super) fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permit_keys_are_the_key_for_permit_0_and_distinct_from_every_lock_key_otherwise() {
        assert_eq!(permit_key("ns/jobs", 0), "ns/jobs");
        assert_eq!(permit_key("ns/jobs", 1), "permit:1:ns/jobs");
        assert_eq!(permit_key("ns/jobs", 12), "permit:12:ns/jobs");
        // Another key's permit cannot be this one: the number ends at the second colon.
        assert_ne!(permit_key("2:ns/jobs", 1), permit_key("ns/jobs", 12));
        assert_ne!(permit_key("ns/jobs", 1), counter_key("ns/jobs"));
    }

    #[test]
    fn a_semaphore_and_its_permits_share_one_wake_channel() {
        assert_eq!(released_channel("ns/jobs"), "{ns/jobs}:released");
        assert_eq!(released_channel(&permit_key("ns/jobs", 7)), "{ns/jobs}:released");
        assert_eq!(released_channel("permit:x:jobs"), "{permit:x:jobs}:released");
        assert_eq!(released_channel("a{b}"), "a{b}:released");
    }

    #[test]
    fn counter_keys_share_the_hash_slot_of_their_lock() {
        assert_eq!(counter_key("orders"), "{orders}:token");
        assert_eq!(counter_key("ns/{tenant}/orders"), "ns/{tenant}/orders:token");
        // `{}` is no hash tag (the whole key is hashed), so the key is wrapped.
        assert_eq!(counter_key("a{}b"), "{a{}b}:token");
    }
}
