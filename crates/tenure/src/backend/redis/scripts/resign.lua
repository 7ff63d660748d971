-- End the caller's term: delete the lease only if the caller holds this
-- term, and announce the release so waiting candidates try at once.
--
-- KEYS[1]  lease hash
-- KEYS[2]  witness (acquire.lua): deleted with the lease, and also when
--          the lease is gone but the witness is still this term's (the
--          holder, having stopped, lets the next candidate in early)
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
  call('DEL', KEYS[1], KEYS[2])
  call('PUBLISH', ARGV[3], 'released:' .. ARGV[2])
  return 1
end
local witness = read_witness(KEYS[2])
if not lease and witness and witness.token == tonumber(ARGV[2]) and witness.owner == ARGV[1] then
  call('DEL', KEYS[2])
  call('PUBLISH', ARGV[3], 'released:' .. ARGV[2])
end
return 0
