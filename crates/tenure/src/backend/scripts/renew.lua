-- Extend the lease if, and only if, the caller still holds this term.
--
-- KEYS[1]  lease hash
-- KEYS[2]  witness (acquire.lua): set again with the lease's new expiry
-- ARGV[1]  holder's instance id
-- ARGV[2]  the term's fencing token
-- ARGV[3]  lease ttl in milliseconds
-- ARGV[4]  events channel (optional): when given, a successful renewal is
--          announced as "renewed:TOKEN:TTL", so waiting followers push their
--          next attempt back instead of asking again
--
-- Returns {1} when renewed; {0} when the lease is gone;
-- {0, owner, token, pttl} when another term holds it.
-- Errors with "TENUREFOREIGN <key> <what>" on data tenure did not write,
-- and "TENURECMD ..." (prelude).

local lease, err = read_lease(KEYS[1])
if err then return err end
if not lease then
  return {0}
end
if lease.owner == ARGV[1] and lease.token == tonumber(ARGV[2]) then
  local witness_err = check_own_witness(KEYS[2], ARGV[2] .. ':' .. ARGV[1])
  if witness_err then return witness_err end
  call('PEXPIRE', KEYS[1], ARGV[3])
  call('SET', KEYS[2], ARGV[2] .. ':' .. ARGV[1], 'PX', ARGV[3])
  if ARGV[4] then
    call('PUBLISH', ARGV[4], 'renewed:' .. ARGV[2] .. ':' .. ARGV[3])
  end
  return {1}
end
return {0, lease.owner, lease.token, call('PTTL', KEYS[1])}
