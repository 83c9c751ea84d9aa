-- Writes a value only for a holder whose fencing token is not lower than the highest one written to the key:
-- a holder that was paused past its lock's validity, and so may be writing after a later holder did, is
-- refused. Run it with EVAL/EVALSHA (redis-cli --eval, or any client):
--   KEYS[1]  the protected key (a string)
--   KEYS[2]  where the highest token written to it is kept (for Redis Cluster, in the same hash slot: put
--            the key in braces, `{report}` and `{report}:fencing-token`)
--   ARGV[1]  the writer's fencing token (REDLOCK_FENCING_TOKEN, or the file REDLOCK_FENCING_TOKEN_FILE names)
--   ARGV[2]  the value
-- Returns 1 once written; an error reply starting with STALE when a higher token was written before, or with
-- ERR when the token is not decimal digits. Equal tokens are the same holder's writes, and are accepted.

local token = ARGV[1]
if type(token) ~= 'string' or not string.find(token, '^%d+$') then
  return redis.error_reply('ERR the fencing token must be decimal digits, got ' .. tostring(token))
end
-- Tokens are compared as decimal strings (length, then digits), never as Lua numbers: those are exact only up
-- to 2^53, and a rounded token could let a stale writer through.
token = (string.gsub(token, '^0+', ''))
if token == '' then
  token = '0'
end
local highest = redis.call('GET', KEYS[2])
if highest and (#highest > #token or (#highest == #token and highest > token)) then
  return redis.error_reply('STALE fencing token ' .. token .. ' is below ' .. highest ..
    ', the highest written to ' .. KEYS[1] .. ': a later holder has written; stop')
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], token)
return 1
