-- Acquire the leases of many elections in one call: acquire_one
-- (acquire_one.lua) on each election's 5 keys and 6 arguments in turn, in
-- the order given, exactly as that many calls of acquire.lua one after the
-- other would, but with one read of the process epoch for all.
--
-- KEYS     5 keys an election, in acquire_one's order
-- ARGV     6 arguments an election, in acquire_one's order
--
-- Returns an array: each election's reply, as acquire.lua returns it, or
-- its error (TENUREFOREIGN ...) as an error element, so that one stray key
-- costs its own election only. A failing command (TENURECMD ..., from the
-- prelude's call) ends the whole call; the elections before it may have
-- been acquired, as when a reply is lost: their next attempt, the same
-- attempt id, adopts them.

if redis.replicate_commands then
  redis.replicate_commands()
end

if #KEYS ~= 5 * (#ARGV / 6) or #ARGV % 6 ~= 0 then
  return redis.error_reply('ERR acquire_many takes 5 keys and 6 arguments an election')
end

local replies = {}
for i = 0, #ARGV / 6 - 1 do
  local K = {KEYS[5 * i + 1], KEYS[5 * i + 2], KEYS[5 * i + 3], KEYS[5 * i + 4], KEYS[5 * i + 5]}
  local A = {ARGV[6 * i + 1], ARGV[6 * i + 2], ARGV[6 * i + 3], ARGV[6 * i + 4], ARGV[6 * i + 5],
    ARGV[6 * i + 6]}
  replies[i + 1] = acquire_one(K, A)
end
return replies
