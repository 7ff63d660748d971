-- End the caller's term: delete the lease only if the caller holds this
-- term, and announce the release so waiting candidates try at once.
--
-- KEYS[1]  lease hash
-- ARGV[1]  holder's instance id
-- ARGV[2]  the term's fencing token
-- ARGV[3]  events channel
--
-- Returns 1 when released, 0 when the caller did not hold the lease
-- (nothing changed). Errors with "TENUREFOREIGN <key> <what>" on data
-- tenure did not write, and "TENURECMD ..." (prelude).

local lease, err = read_lease(KEYS[1])
if err then return err end
if lease and lease.owner == ARGV[1] and lease.token == tonumber(ARGV[2]) then
  call('DEL', KEYS[1])
  call('PUBLISH', ARGV[3], 'released:' .. ARGV[2])
  return 1
end
return 0
