-- Read who holds the lease, without changing anything.
--
-- KEYS[1]  lease hash
--
-- Returns {} when nobody holds it, else
-- {owner, token, pttl_ms, since_ms, attempt, ttl_ms}.
-- Errors with "TENUREFOREIGN <key> <what>" on data tenure did not write
-- (a lease without an expiry included), and "TENURECMD ..." (prelude).

local lease, err = read_lease(KEYS[1])
if err then return err end
if not lease then
  return {}
end
local pttl = call('PTTL', KEYS[1])
if pttl < 0 then
  return foreign(KEYS[1], 'is a lease without an expiry')
end
return {lease.owner, lease.token, pttl, lease.since, lease.attempt, lease.ttl}
