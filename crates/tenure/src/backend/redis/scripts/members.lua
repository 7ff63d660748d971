-- Heartbeat of a partition-set member, and the list of live members.
--
-- KEYS[1]  sorted set of members, scored by heartbeat expiry (server ms)
-- ARGV[1]  member id
-- ARGV[2]  heartbeat ttl in milliseconds
-- ARGV[3]  "1" to join or stay, "0" to leave
--
-- Returns {members, phantoms}: the live member ids, sorted (expired ones
-- are removed first), and how many entries have a heartbeat expiring more
-- than 2 ttl from now. No member writes those; they are ignored, so a
-- forged or corrupted entry cannot hold partitions unowned.
-- Errors with "TENUREFOREIGN <key> <what>" if the key is not a sorted set,
-- and "TENURECMD ..." (prelude).

local key_type = call('TYPE', KEYS[1]).ok
if key_type ~= 'none' and key_type ~= 'zset' then
  return foreign(KEYS[1], 'holds a ' .. key_type .. ', not a member set')
end
local now_ms = server_ms()
local ttl = tonumber(ARGV[2])
local horizon = now_ms + 2 * ttl
call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if ARGV[3] == '1' then
  call('ZADD', KEYS[1], now_ms + ttl, ARGV[1])
  -- A group nobody runs any more disappears by itself.
  call('PEXPIRE', KEYS[1], ttl * 10)
else
  call('ZREM', KEYS[1], ARGV[1])
end
local members = call('ZRANGEBYSCORE', KEYS[1], '(' .. now_ms, horizon)
table.sort(members)
return {members, call('ZCOUNT', KEYS[1], '(' .. horizon, '+inf')}
