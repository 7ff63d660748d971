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

local results = {}
for i = 1, #KEYS / 2 do
  local key = KEYS[2 * i - 1]
  local lease, err = read_lease(key)
  if not err and lease and lease.owner == ARGV[1] then
    err = check_own_witness(KEYS[2 * i], ARGV[2 + i] .. ':' .. ARGV[1])
    if err then key = KEYS[2 * i] end
  end
  if err then
    local detail = string.sub(err.err, string.len('TENUREFOREIGN ' .. key .. ' ') + 1)
    results[i] = {-1, key, detail}
  elseif not lease then
    results[i] = 0
  elseif lease.owner == ARGV[1] and lease.token == tonumber(ARGV[2 + i]) then
    call('PEXPIRE', key, ARGV[2])
    call('SET', KEYS[2 * i], ARGV[2 + i] .. ':' .. ARGV[1], 'PX', ARGV[2])
    results[i] = 1
  else
    results[i] = {0, lease.owner, lease.token, call('PTTL', key)}
  end
end
return results
