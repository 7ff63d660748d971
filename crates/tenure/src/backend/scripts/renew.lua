-- Extend the lease if, and only if, the caller still owns this term.
--
-- KEYS[1]  lease hash
-- ARGV[1]  owner's instance id
-- ARGV[2]  the term's fencing token
-- ARGV[3]  lease ttl in milliseconds
-- ARGV[4]  events channel (optional): when given, a successful renewal is
--          announced as "renewed:TOKEN:TTL", so waiting followers push their
--          next attempt back instead of asking again
--
-- Returns {1} when renewed; {0} when the lease is gone;
-- {0, owner, token, pttl} when another term holds it.
-- Errors with "TENUREFOREIGN <key> <what>" on data tenure did not write.

local lease_type = redis.call('TYPE', KEYS[1]).ok
if lease_type == 'none' then
  return {0}
elseif lease_type ~= 'hash' then
  return redis.error_reply('TENUREFOREIGN ' .. KEYS[1] .. ' holds a ' .. lease_type .. ', not a lease hash')
end
local fields = redis.call('HMGET', KEYS[1], 'owner', 'token')
if fields[1] == ARGV[1] and fields[2] == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  if ARGV[4] then
    redis.call('PUBLISH', ARGV[4], 'renewed:' .. ARGV[2] .. ':' .. ARGV[3])
  end
  return {1}
end
if not fields[1] or not tonumber(fields[2]) then
  return redis.error_reply('TENUREFOREIGN ' .. KEYS[1] .. ' is a hash without the owner/token fields of a lease')
end
return {0, fields[1], tonumber(fields[2]), redis.call('PTTL', KEYS[1])}
