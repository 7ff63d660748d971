-- Acquire the lease of one election, or report who holds it.
--
-- KEYS[1]  lease hash (fields owner, token, since)
-- KEYS[2]  fencing-token counter (string)
-- KEYS[3]  epoch hash (fields run_id, since): which Redis process this
--          election's data was first seen on, and when
-- ARGV[1]  candidate's instance id
-- ARGV[2]  lease ttl in milliseconds
-- ARGV[3]  events channel
--
-- Returns {won, token, owner, ttl_ms, since_ms}:
--   won = 1: the candidate holds the lease, either a new term (token is new)
--            or its own term adopted after a retry (TTL extended to ARGV[2]);
--   won = 0: another owner holds it; ttl_ms is its remaining PTTL. An empty
--            owner means nobody holds it but no lease may be granted for
--            ttl_ms yet (the start-up grace period, below).
-- Errors with "TENUREFOREIGN <key> <what>" when a key holds data tenure did
-- not write; nothing is modified then.
--
-- The token is max(last token + 1, server time in ms): it rises with every
-- term and, because the server's clock keeps moving while Redis restarts,
-- stays above every earlier token even after all data was lost.
--
-- Start-up grace period: when this election's data is new to the Redis
-- process serving it (first use, a restart that lost or rolled back data, a
-- failover to a replica), a leader from before may still hold a lease that
-- this server does not know. No lease is granted until one ttl after that
-- moment, by when any such leader has passed its local deadline.

if redis.replicate_commands then
  redis.replicate_commands()
end

local function foreign(key, what)
  return redis.error_reply('TENUREFOREIGN ' .. key .. ' ' .. what)
end

local ttl = tonumber(ARGV[2])
local lease_type = redis.call('TYPE', KEYS[1]).ok
if lease_type == 'hash' then
  local fields = redis.call('HMGET', KEYS[1], 'owner', 'token', 'since')
  local owner, token, since = fields[1], tonumber(fields[2]), tonumber(fields[3])
  if not owner or not token or not since then
    return foreign(KEYS[1], 'is a hash without the owner/token/since fields of a lease')
  end
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ttl)
    return {1, token, owner, ttl, since}
  end
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then
    return foreign(KEYS[1], 'is a lease without an expiry')
  end
  return {0, token, owner, pttl, since}
elseif lease_type ~= 'none' then
  return foreign(KEYS[1], 'holds a ' .. lease_type .. ', not a lease hash')
end

local last = 0
local counter_type = redis.call('TYPE', KEYS[2]).ok
if counter_type == 'string' then
  last = tonumber(redis.call('GET', KEYS[2]))
  if not last then
    return foreign(KEYS[2], 'holds a string that is not a token')
  end
elseif counter_type ~= 'none' then
  return foreign(KEYS[2], 'holds a ' .. counter_type .. ', not a token')
end

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
local epoch_type = redis.call('TYPE', KEYS[3]).ok
if epoch_type ~= 'none' and epoch_type ~= 'hash' then
  return foreign(KEYS[3], 'holds a ' .. epoch_type .. ', not an epoch hash')
end
local epoch = redis.call('HMGET', KEYS[3], 'run_id', 'since')
local epoch_since = tonumber(epoch[2])
if epoch[1] ~= run_id or not epoch_since then
  epoch_since = now_ms
  redis.call('HSET', KEYS[3], 'run_id', run_id, 'since', string.format('%d', now_ms))
end
if now_ms < epoch_since + ttl then
  return {0, 0, '', epoch_since + ttl - now_ms, 0}
end

local token = math.max(last + 1, now_ms)
local token_text = string.format('%d', token)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', token_text, 'since', string.format('%d', now_ms))
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('SET', KEYS[2], token_text)
redis.call('PUBLISH', ARGV[3], 'acquired:' .. token_text)
return {1, token, ARGV[1], ttl, now_ms}
