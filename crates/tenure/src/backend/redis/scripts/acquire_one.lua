-- acquire_one(K, A): acquire the lease of one election, or report who holds
-- it. K and A are the election's keys and arguments (KEYS and ARGV of
-- acquire.lua; a slice of them in acquire_many.lua). Defined here once, for
-- both scripts.
--
-- K[1]  lease hash (fields owner, token, since, attempt, ttl)
-- K[2]  fencing-token counter (string)
-- K[3]  epoch hash (fields run_id, since, ttl): which Redis process and
--       replication history ("RUN_ID:REPLID") this election's data was
--       first seen on, when, and the largest ttl granted since
-- K[4]  the prefix's epoch hash (fields run_id, since): when the Redis
--       process serving it first served any election under the prefix
--       (on a cluster, a key per slot: a script may touch one slot only)
-- K[5]  witness (string "TOKEN:OWNER" of the term that holds the lease;
--       expires with the lease, is renewed with it, and is deleted only
--       by the holder's release): while it lives without the lease, the
--       lease vanished some other way (deleted by hand, evicted), and
--       its holder may still be acting until the witness expires
--
-- No key that may be missing for good is named: during a cluster slot
-- migration Redis refuses (TRYAGAIN) a script whose keys are partly absent
-- on the node, so a never-written key would block every acquisition of the
-- slot until the migration ends.
-- A[1]  candidate's instance id
-- A[2]  lease ttl in milliseconds
-- A[3]  events channel
-- A[4]  attempt: a nonce naming this campaign; only a retry of the same
--       attempt adopts a lease it finds under its id
-- A[5]  hold-off in milliseconds: the largest ttl the candidate knows to be
--       in use for this election (its own, its max_ttl setting, the
--       longest lease it has seen)
-- A[6]  ttl of the token counter and the epoch, in milliseconds
--
-- Returns {won, token, owner, ttl_ms, since_ms, attempt, lease_ttl_ms}:
--   won = 1: the candidate holds the lease, either a new term (token is new)
--         or the lease its own attempt wrote before its reply was lost
--         (TTL extended to ARGV[2]);
--   won = 0: another term holds it (possibly under the same id, by another
--         attempt); ttl_ms is its PTTL, lease_ttl_ms the ttl it was
--         granted with (0 for leases written before tenure 0.2);
--   won = 2: nobody holds it, but no lease may be granted for ttl_ms yet
--         (the start-up hold-off, below, or a lease that vanished
--         without its holder's release: the witness's PTTL).
-- Errors with "TENUREFOREIGN <key> <what>" when a key holds data tenure did
-- not write (nothing is modified then), and "TENURECMD ..." (prelude).
--
-- The token is max(last token + 1, server time in ms): it rises with every
-- term. The counter expires after ARGV[6] of inactivity, and the server's
-- clock, which keeps moving while the counter is gone or Redis restarts,
-- keeps new tokens above every earlier one.
--
-- Start-up hold-off: when this election's data is new to the Redis
-- process serving it (first use, a restart that lost or rolled back data, a
-- failover to a replica, a failback to a primary that was a replica
-- meanwhile: its run_id is the same, but its replication ID is new), a
-- leader from before may still hold a lease that
-- this server does not know, with a ttl up to the largest in use. No lease
-- is granted, and no lease found is adopted, until that long after the
-- moment the process first served the election. A name new to this
-- process gets no lease from before its start, so for it the period counts
-- from when the process first served any election of the prefix: on a
-- Redis that has run longer than that, a new election's first candidate is
-- elected at once.

-- Read an epoch hash: {} when there is none, or nil and an error reply
-- when the key holds anything but exactly an epoch's fields.
local function read_epoch(key)
  local key_type = call('TYPE', key).ok
  if key_type == 'none' then
    return {}
  elseif key_type ~= 'hash' then
    return nil, foreign(key, 'holds a ' .. key_type .. ', not an epoch hash')
  end
  local f = call('HMGET', key, 'run_id', 'since', 'ttl')
  local present = 0
  for i = 1, 3 do
    if f[i] then present = present + 1 end
  end
  local epoch = {run_id = f[1], since = tonumber(f[2]), ttl = tonumber(f[3] or '0')}
  if not epoch.run_id or not epoch.since or not epoch.ttl or call('HLEN', key) ~= present then
    return nil, foreign(key, 'is a hash without exactly the fields of an epoch (run_id, since, ttl)')
  end
  return epoch
end

-- The process epoch (process_epoch, in the prelude) of the server running
-- this script: read at most once per script call, however many elections
-- it acquires. A script runs whole on one process, so no restart or
-- promotion can come between two elections of one call, and the epoch
-- each of them is checked against is the one a call of its own would read.
-- Its two INFO calls were most of an acquisition's cost on the server.
local epoch_memo = nil
local function current_epoch()
  if not epoch_memo then
    epoch_memo = process_epoch()
  end
  return epoch_memo
end

local function acquire_one(K, A)
  local ttl = tonumber(A[2])
  local hold_off = math.max(ttl, tonumber(A[5]))
  local aux_ttl = tonumber(A[6])

  local lease, err = read_lease(K[1])
  if err then return err end

  local last = 0
  local counter_type = call('TYPE', K[2]).ok
  if counter_type == 'string' then
    last = tonumber(call('GET', K[2]))
    if not last then
      return foreign(K[2], 'holds a string that is not a token')
    end
  elseif counter_type ~= 'none' then
    return foreign(K[2], 'holds a ' .. counter_type .. ', not a token')
  end

  local witness, witness_err = read_witness(K[5])
  if witness_err then return witness_err end

  local epoch, epoch_err = read_epoch(K[3])
  if epoch_err then return epoch_err end
  local prefix_epoch, prefix_err = read_epoch(K[4])
  if prefix_err then return prefix_err end

  local now_ms = server_ms()

  if lease and not (lease.owner == A[1] and lease.attempt == A[4]) then
    local pttl = call('PTTL', K[1])
    if pttl < 0 then
      return foreign(K[1], 'is a lease without an expiry')
    end
    return {0, lease.token, lease.owner, pttl, lease.since, lease.attempt, lease.ttl}
  end

  -- The process and its replication history: a restart changes the first, a
  -- promotion (failover, failback) the second. Read only past the common
  -- answer above (the lease is another's), which needs neither: its two INFO
  -- calls were most of the cost of a follower's look at a held lease.
  local run_id = current_epoch()

  -- Every write below needs PEXPIRE; prove it is allowed before the first
  -- (a no-op on the absent lease; our own lease is extended below anyway).
  if not lease then
    call('PEXPIRE', K[1], ttl)
  end

  if prefix_epoch.run_id ~= run_id then
    prefix_epoch = {run_id = run_id, since = now_ms}
    call('HSET', K[4], 'run_id', run_id, 'since', string.format('%d', now_ms))
  end
  call('PEXPIRE', K[4], aux_ttl)
  if epoch.run_id ~= run_id then
    -- New to this process: the hold-off starts when the process began
    -- serving the prefix. A rolled-back epoch still tells the largest ttl
    -- granted before.
    epoch = {run_id = run_id, since = prefix_epoch.since, ttl = math.max(epoch.ttl or 0, hold_off)}
    call('HSET', K[3], 'run_id', run_id, 'since', string.format('%d', epoch.since),
      'ttl', string.format('%d', epoch.ttl))
  end
  call('PEXPIRE', K[3], aux_ttl)
  local wait = epoch.since + math.max(epoch.ttl, hold_off) - now_ms
  if wait > 0 then
    return {2, 0, '', wait, 0, '', 0}
  end

  if lease then
    -- Our own attempt's lease, whose reply was lost: adopt it.
    call('PEXPIRE', K[1], ttl)
    call('SET', K[5], string.format('%d', lease.token) .. ':' .. lease.owner, 'PX', ttl)
    return {1, lease.token, lease.owner, ttl, lease.since, lease.attempt, ttl}
  end

  -- Only the holder's release deletes the witness: a lease that vanished
  -- any other way counts as a crash, and nobody is granted the election
  -- until the witness (renewed with the lease) runs out.
  if witness and witness.pttl > 0 then
    return {2, 0, '', witness.pttl, 0, '', 0}
  end

  local token = math.max(last + 1, now_ms)
  local token_text = string.format('%d', token)
  call('PUBLISH', A[3], 'acquired:' .. token_text)
  call('SET', K[2], token_text, 'PX', aux_ttl)
  if ttl > epoch.ttl then
    call('HSET', K[3], 'ttl', string.format('%d', ttl))
  end
  call('HSET', K[1], 'owner', A[1], 'token', token_text, 'since', string.format('%d', now_ms),
    'attempt', A[4], 'ttl', string.format('%d', ttl))
  call('PEXPIRE', K[1], ttl)
  call('SET', K[5], token_text .. ':' .. A[1], 'PX', ttl)
  return {1, token, A[1], ttl, now_ms, A[4], ttl}
end
