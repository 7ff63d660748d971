-- Extend the lease if, and only if, the caller still holds this term.
--
-- KEYS[1]  lease hash
-- KEYS[2]  witness (acquire.lua): set again with the lease's new expiry
-- ARGV[1]  holder's instance id
-- ARGV[2]  the term's fencing token
-- KEYS[3]  the prefix's epoch hash (acquire.lua)
-- ARGV[3]  lease ttl in milliseconds
-- ARGV[4]  ttl of the epoch hash, in milliseconds
-- ARGV[5]  events channel (optional): when given, a successful renewal is
--          announced as "renewed:TOKEN:TTL", so waiting followers push their
--          next attempt back instead of asking again
--
-- A renewal that finds the prefix's epoch naming another process (a leader
-- renewing on the replica a failover promoted, which no candidate has
-- asked yet) records this process as first serving the prefix now, as
-- acquire.lua would: the start-up hold-off then runs while the leader
-- keeps its term, instead of at the next hand-over. That is safe: every
-- leader from before the failover renewed on the old process, so its
-- deadline ends within a ttl of the failover, before this instant plus
-- the largest ttl. An epoch key holding anything else is left alone
-- (acquire.lua reports it).
--
-- Returns {1} when renewed; {0} when the lease is gone;
-- {0, owner, token, pttl} when another term holds it.
-- Errors with "TENUREFOREIGN <key> <what>" on data tenure did not write,
-- and "TENURECMD ..." (prelude).

if redis.replicate_commands then
  redis.replicate_commands()
end

-- See above: record `run_id` as first serving the prefix now, unless the
-- epoch already names it or is not an epoch tenure wrote.
local function note_first_served(key, run_id)
  -- The common case, an epoch naming this process, costs one HGET (on
  -- another type it answers an error, which names no process).
  if redis.pcall('HGET', key, 'run_id') == run_id then
    return
  end
  local key_type = call('TYPE', key).ok
  if key_type == 'hash' then
    local fields = call('HLEN', key)
    if (fields ~= 2 and fields ~= 3) or not tonumber(call('HGET', key, 'since')) then
      return
    end
  elseif key_type ~= 'none' then
    return
  end
  call('HSET', key, 'run_id', run_id, 'since', string.format('%d', server_ms()))
  call('PEXPIRE', key, ARGV[4])
end

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
  note_first_served(KEYS[3], process_epoch())
  if ARGV[5] then
    call('PUBLISH', ARGV[5], 'renewed:' .. ARGV[2] .. ':' .. ARGV[3])
  end
  return {1}
end
return {0, lease.owner, lease.token, call('PTTL', KEYS[1])}
