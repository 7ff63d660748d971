-- Prepended to every tenure script when it is loaded (see backend/redis/mod.rs).
--
-- call(...) runs a command like redis.call, but a failure names the command:
-- "TENURECMD <COMMAND> <error>". Inside a script Redis reports a missing ACL
-- permission or a renamed command as a plain ERR without saying which
-- command, and tenure must tell a missing permission (a person has to act)
-- from a transient error (retry).
--
-- Every script reads and checks everything before its first write, and
-- orders its writes so that a failure part-way leaves nothing harmful: a
-- token counter that moved on, or an epoch recorded early. A lease is
-- never written without its expiry: PEXPIRE is proven allowed on the probe
-- key (which never exists, so it is a no-op) before the lease is written.

local function call(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    error({err = 'TENURECMD ' .. string.upper(tostring((...))) .. ' ' .. reply.err})
  end
  return reply
end

local function foreign(key, what)
  return redis.error_reply('TENUREFOREIGN ' .. key .. ' ' .. what)
end

-- Read a lease hash: nil when there is none, or nil and an error reply
-- when the key holds anything but exactly the fields tenure writes
-- (owner, token, since, and, since tenure 0.2, attempt and ttl).
local function read_lease(key)
  local key_type = call('TYPE', key).ok
  if key_type == 'none' then
    return nil
  elseif key_type ~= 'hash' then
    return nil, foreign(key, 'holds a ' .. key_type .. ', not a lease hash')
  end
  local f = call('HMGET', key, 'owner', 'token', 'since', 'attempt', 'ttl')
  local present = 0
  for i = 1, 5 do
    if f[i] then present = present + 1 end
  end
  local lease = {
    owner = f[1], token = tonumber(f[2]), since = tonumber(f[3]),
    attempt = f[4] or '', ttl = tonumber(f[5] or '0'),
  }
  if not lease.owner or not lease.token or not lease.since or not lease.ttl
      or call('HLEN', key) ~= present then
    return nil, foreign(key, 'is a hash without exactly the fields of a lease (owner, token, since, attempt, ttl)')
  end
  return lease
end

local function server_ms()
  local time = call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- Which Redis process and replication history serves the keys,
-- "RUN_ID:REPLID": a restart changes the first, a promotion (failover,
-- failback) the second.
local function process_epoch()
  return (string.match(call('INFO', 'server'), 'run_id:(%w+)') or '') .. ':' ..
    (string.match(call('INFO', 'replication'), 'master_replid:(%w+)') or '')
end


-- Read a last-run marker (the fenced hash of tenure::FencedKey: fields
-- token, and value = the server's clock in ms when the run was recorded;
-- and slot, the last scheduled slot claimed, in ms, once one was):
-- nil when there is none, or nil and an error reply when the key holds
-- anything else.
local function read_marker(key)
  local key_type = call('TYPE', key).ok
  if key_type == 'none' then
    return nil
  elseif key_type ~= 'hash' then
    return nil, foreign(key, 'holds a ' .. key_type .. ', not a last-run marker')
  end
  local f = call('HMGET', key, 'token', 'value', 'slot')
  local marker = {token = tonumber(f[1]), at = tonumber(f[2]), slot = tonumber(f[3])}
  local fields = 2
  if f[3] then fields = 3 end
  if not marker.token or not marker.at or (f[3] and not marker.slot)
      or call('HLEN', key) ~= fields then
    return nil, foreign(key, 'is not a last-run marker (a hash of a token, the ms of the run and maybe a slot)')
  end
  return marker
end

-- Read a witness (see acquire.lua): the token and owner it names
-- ("TOKEN:OWNER") and its PTTL, nil
-- when there is none, or nil and an error reply when the key holds
-- anything else.
local function read_witness(key)
  local key_type = call('TYPE', key).ok
  if key_type == 'none' then
    return nil
  elseif key_type ~= 'string' then
    return nil, foreign(key, 'holds a ' .. key_type .. ', not a witness')
  end
  local token, owner = string.match(call('GET', key), '^(%d+):(.+)$')
  if not token then
    return nil, foreign(key, 'holds a string that is not a witness (TOKEN:OWNER)')
  end
  local pttl = call('PTTL', key)
  if pttl < 0 then
    return nil, foreign(key, 'is a witness without an expiry')
  end
  return {token = tonumber(token), owner = owner, pttl = pttl}
end

-- Check a renewal's witness before it is set again: the term's own value
-- (OWN, "TOKEN:OWNER") costs one GET, the common case on every renewal of
-- every partition; anything else is judged by read_witness, so that data
-- tenure did not write is refused, never overwritten. nil, or the error.
local function check_own_witness(key, own)
  if redis.pcall('GET', key) == own then
    return nil
  end
  local _, err = read_witness(key)
  return err
end
