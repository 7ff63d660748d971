-- Write a value only if the writer's fencing token is not older than the
-- newest token that has written it.
--
-- KEYS[1]  fenced hash (fields token, value)
-- ARGV[1]  writer's fencing token
-- ARGV[2]  value
--
-- Returns {1} when written, {0, highest} when rejected as stale.
-- Errors with "TENUREFOREIGN <key> <what>" if the key is not a hash of
-- exactly the fields token and value (nothing is written then), and
-- "TENURECMD ..." (prelude).

local key_type = call('TYPE', KEYS[1]).ok
local highest = 0
if key_type == 'hash' then
  local f = call('HMGET', KEYS[1], 'token', 'value')
  highest = tonumber(f[1])
  if not highest or not f[2] or call('HLEN', KEYS[1]) ~= 2 then
    return foreign(KEYS[1], 'is a hash without exactly the fields token and value of a fenced key')
  end
elseif key_type ~= 'none' then
  return foreign(KEYS[1], 'holds a ' .. key_type .. ', not a fenced hash')
end
local token = tonumber(ARGV[1])
if token < highest then
  return {0, highest}
end
call('HSET', KEYS[1], 'token', ARGV[1], 'value', ARGV[2])
return {1}
