-- Record a run now, if the caller's term still holds the lease; with a
-- slot, also claim that scheduled slot, once and in order.
--
-- KEYS[1]  lease hash
-- KEYS[2]  last-run marker hash (same hash tag)
-- ARGV[1]  holder's instance id
-- ARGV[2]  the term's fencing token
-- ARGV[3]  how long to keep the record, in milliseconds (1 to 100 years)
-- ARGV[4]  the slot claimed (ms since the Unix epoch), or '' for none
--
-- Returns 1 when recorded; 0 when refused (the lease is gone or held by
-- another term, a newer term has recorded a run, or the slot is not
-- later than the one recorded; nothing changed). A record without a slot
-- keeps the recorded one.
-- Errors with "TENUREFOREIGN <key> <what>" on data tenure did not write,
-- and "TENURECMD ..." (prelude). The expiry is proven allowed when
-- connecting (check.lua), so the marker is never left without one.

local lease, err = read_lease(KEYS[1])
if err then return err end
local marker, merr = read_marker(KEYS[2])
if merr then return merr end
local token = tonumber(ARGV[2])
local keep = tonumber(ARGV[3])
if not keep or keep < 1 or keep > 3153600000000 or keep % 1 ~= 0 then
  -- Checked before anything is written: the marker never lacks an expiry.
  return redis.error_reply('ERR record_run: keep must be 1 to 3153600000000 ms, got ' .. tostring(ARGV[3]))
end
local slot = nil
if ARGV[4] ~= '' then
  slot = tonumber(ARGV[4])
  if not slot or slot < 0 or slot % 1 ~= 0 then
    return redis.error_reply('ERR record_run: a slot must be a whole number of ms, got ' .. tostring(ARGV[4]))
  end
end
if not lease or lease.owner ~= ARGV[1] or lease.token ~= token then
  return 0
end
if marker and marker.token > token then
  return 0
end
if slot and marker and marker.slot and marker.slot >= slot then
  return 0
end
call('HSET', KEYS[2], 'token', ARGV[2], 'value', server_ms())
if slot then
  call('HSET', KEYS[2], 'slot', ARGV[4])
end
call('PEXPIRE', KEYS[2], ARGV[3])
return 1
