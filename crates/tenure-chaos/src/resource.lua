-- The shared resource every leader writes to: accepts a write only if its
-- fencing token is not older than the newest token accepted so far, and
-- keeps the accepted writes in order for the checker.
--
-- KEYS[1]  hash with field `highest`
-- KEYS[2]  list of accepted writes, "TOKEN INSTANCE", in acceptance order
-- ARGV[1]  writer's fencing token
-- ARGV[2]  writer's instance id
-- ARGV[3]  "1" to enforce fencing, "0" to accept everything (unsafe mode)
--
-- Returns {1, token} when accepted, {0, highest} when rejected as stale.

local highest = tonumber(redis.call('HGET', KEYS[1], 'highest') or '0')
local token = tonumber(ARGV[1])
if ARGV[3] == '1' and token < highest then
  return {0, highest}
end
if token > highest then
  redis.call('HSET', KEYS[1], 'highest', ARGV[1])
end
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2])
return {1, token}
