-- Read who holds the lease, without changing anything.
--
-- KEYS[1]  lease hash
--
-- Returns {} when nobody holds it, else {owner, token, pttl_ms, since_ms}.
-- Errors with "TENUREFOREIGN <key> <what>" on data tenure did not write.

local lease_type = redis.call('TYPE', KEYS[1]).ok
if lease_type == 'none' then
  return {}
elseif lease_type ~= 'hash' then
  return redis.error_reply('TENUREFOREIGN ' .. KEYS[1] .. ' holds a ' .. lease_type .. ', not a lease hash')
end
local fields = redis.call('HMGET', KEYS[1], 'owner', 'token', 'since')
if not fields[1] or not tonumber(fields[2]) or not tonumber(fields[3]) then
  return redis.error_reply('TENUREFOREIGN ' .. KEYS[1] .. ' is a hash without the owner/token/since fields of a lease')
end
return {fields[1], tonumber(fields[2]), redis.call('PTTL', KEYS[1]), tonumber(fields[3])}
