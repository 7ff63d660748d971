-- Heartbeat of a partition-set member, and the list of live members.
--
-- KEYS[1]  sorted set of members, scored by heartbeat expiry (server ms)
-- ARGV[1]  member id
-- ARGV[2]  heartbeat ttl in milliseconds
-- ARGV[3]  "1" to join or stay, "0" to leave
--
-- Returns the live member ids (expired ones are removed first), sorted.
-- Errors with "TENUREFOREIGN <key> <what>" if the key is not a sorted set.

local key_type = redis.call('TYPE', KEYS[1]).ok
if key_type ~= 'none' and key_type ~= 'zset' then
  return redis.error_reply('TENUREFOREIGN ' .. KEYS[1] .. ' holds a ' .. key_type .. ', not a member set')
end
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[1], now_ms + ttl, ARGV[1])
  -- A group nobody runs any more disappears by itself.
  redis.call('PEXPIRE', KEYS[1], ttl * 10)
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(members)
return members
