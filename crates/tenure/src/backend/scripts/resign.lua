-- End the caller's term: delete the lease only if the caller owns this
-- term, and announce the release so waiting candidates try at once.
--
-- KEYS[1]  lease hash
-- ARGV[1]  owner's instance id
-- ARGV[2]  the term's fencing token
-- ARGV[3]  events channel
--
-- Returns 1 when released, 0 when the caller did not hold the lease
-- (nothing changed).

local lease_type = redis.call('TYPE', KEYS[1]).ok
if lease_type ~= 'hash' then
  return 0
end
local fields = redis.call('HMGET', KEYS[1], 'owner', 'token')
if fields[1] == ARGV[1] and fields[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], 'released:' .. ARGV[2])
  return 1
end
return 0
