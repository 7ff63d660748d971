-- Write a value only if the writer's fencing token is not older than the
-- newest token that has written it.
--
-- KEYS[1]  fenced hash (fields token, value)
-- ARGV[1]  writer's fencing token
-- ARGV[2]  value
--
-- Returns {1} when written, {0, highest} when rejected as stale.
-- Errors with "TENUREFOREIGN <key> <what>" if the key is not a fenced hash.

local key_type = redis.call('TYPE', KEYS[1]).ok
if key_type ~= 'none' and key_type ~= 'hash' then
  return redis.error_reply('TENUREFOREIGN ' .. KEYS[1] .. ' holds a ' .. key_type .. ', not a fenced hash')
end
local token = tonumber(ARGV[1])
local highest = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
if not highest then
  return redis.error_reply('TENUREFOREIGN ' .. KEYS[1] .. ' has a token field that is not a number')
end
if token < highest then
  return {0, highest}
end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'value', ARGV[2])
return {1}
