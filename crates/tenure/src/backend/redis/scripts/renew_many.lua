-- Extend many leases of one instance at once: renew.lua's check and
-- PEXPIRE for each, without announcements (partition sets have no
-- followers). One call instead of one per lease keeps a set of thousands
-- of partitions at one short command per thousand renewals.
--
-- KEYS[2i-1] lease hash of the i-th term
-- KEYS[2i]   its witness (acquire.lua), set again with the new expiry
-- ARGV[1]    holder's instance id
-- ARGV[2]    lease ttl in milliseconds
-- ARGV[2+i]  the i-th term's fencing token
--
-- Returns one entry per term, in order: 1 when renewed; 0 when the lease
-- is gone; {0, owner, token, pttl} when another term holds it; {-1, key,
-- what} when the key holds data tenure did not write (left untouched).
-- (Plain numbers for the common answers: a reply of 100,000 entries is
-- read without 100,000 nested arrays.) Errors with "TENURECMD ..."
-- (prelude).

-- The common case first, in four of the cheapest commands: the lease is a
-- hash whose owner and token are the term's (a token is never given twice,
-- so only this term wrote it) and the witness is the term's own value. Both
-- get the new expiry; PEXPIRE of the witness is SET of the same value with
-- PX, without the copy. Anything else takes the full reading below
-- (read_lease's TYPE and exact fields, read_witness), which judges foreign
-- data and other terms: a renewal of 100,000 partitions is six commands a
-- term there, and kept a core busy.
local id, ttl_ms, own_suffix = ARGV[1], ARGV[2], ':' .. ARGV[1]
local function renewed_at_once(key, witness, token)
  local f = redis.pcall('HMGET', key, 'owner', 'token')
  if type(f) ~= 'table' or f[1] ~= id or f[2] ~= token then
    return false
  end
  if redis.pcall('GET', witness) ~= token .. own_suffix then
    return false
  end
  call('PEXPIRE', key, ttl_ms)
  call('PEXPIRE', witness, ttl_ms)
  return true
end

-- The full reading: read_lease, check_own_witness, and the answer for
-- anything but the term's own lease.
local function renewed_or_why(i)
  local key = KEYS[2 * i - 1]
  local lease, err = read_lease(key)
  if not err and lease and lease.owner == ARGV[1] then
    err = check_own_witness(KEYS[2 * i], ARGV[2 + i] .. ':' .. ARGV[1])
    if err then key = KEYS[2 * i] end
  end
  if err then
    local detail = string.sub(err.err, string.len('TENUREFOREIGN ' .. key .. ' ') + 1)
    return {-1, key, detail}
  elseif not lease then
    return 0
  elseif lease.owner == ARGV[1] and lease.token == tonumber(ARGV[2 + i]) then
    call('PEXPIRE', key, ARGV[2])
    call('SET', KEYS[2 * i], ARGV[2 + i] .. ':' .. ARGV[1], 'PX', ARGV[2])
    return 1
  else
    return {0, lease.owner, lease.token, call('PTTL', key)}
  end
end

local results = {}
for i = 1, #KEYS / 2 do
  if renewed_at_once(KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 + i]) then
    results[i] = 1
  else
    results[i] = renewed_or_why(i)
  end
end
return results
