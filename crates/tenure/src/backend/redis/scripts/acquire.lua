-- Acquire the lease of one election, or report who holds it: acquire_one
-- (acquire_one.lua) on KEYS and ARGV, as it documents them.

if redis.replicate_commands then
  redis.replicate_commands()
end

return acquire_one(KEYS, ARGV)
