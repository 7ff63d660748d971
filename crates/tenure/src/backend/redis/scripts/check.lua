-- Prove, when connecting, that the Redis user may run every command
-- tenure's scripts run, so that a missing ACL permission or a renamed
-- command is reported at once, by name, instead of part-way through a
-- lease operation. Also reports the eviction settings.
--
-- KEYS[1]  probe key: never holds data (anything there is foreign)
-- ARGV[1]  events channel (receives a "probe" message, which is ignored)
-- ARGV[2]  "1" to check the commands of partition sets too
--
-- Returns {maxmemory, maxmemory_policy}. Errors with "TENURECMD ..."
-- (prelude) naming the first command the user may not run.

local probe = KEYS[1]
local probe_type = call('TYPE', probe).ok
if probe_type ~= 'none' then
  return foreign(probe, 'holds a ' .. probe_type .. '; tenure never writes this key')
end
call('HMGET', probe, 'owner')
call('HLEN', probe)
call('PTTL', probe)
call('GET', probe)
server_ms()
call('INFO', 'server')
local memory = call('INFO', 'memory')
-- No-ops on a key that does not exist.
call('PEXPIRE', probe, 1000)
call('DEL', probe)
call('PUBLISH', ARGV[1], 'probe')
-- Writes, each undone by the DEL proven above.
call('SET', probe, '1', 'PX', 1000)
call('DEL', probe)
call('HSET', probe, 'probe', '1')
call('DEL', probe)
if ARGV[2] == '1' then
  call('ZRANGEBYSCORE', probe, 0, 1)
  call('ZCOUNT', probe, 0, 1)
  call('ZREMRANGEBYSCORE', probe, 0, 1)
  call('ZREM', probe, 'probe')
  call('ZADD', probe, 1, 'probe')
  call('DEL', probe)
end
return {
  tonumber(string.match(memory, 'maxmemory:(%d+)') or '0'),
  string.match(memory, 'maxmemory_policy:([%w-]+)') or 'noeviction',
}
