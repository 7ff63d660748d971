-- How long ago the election's last successful run was recorded, by the
-- server's clock.
--
-- KEYS[1]  last-run marker hash (fields token, value)
--
-- Returns {} when no run is remembered, else {age_ms, token}: age_ms is 0
-- if the server's clock stepped back since the record.
-- Errors with "TENUREFOREIGN <key> <what>" on data tenure did not write,
-- and "TENURECMD ..." (prelude).

local marker, err = read_marker(KEYS[1])
if err then return err end
if not marker then
  return {}
end
local age = server_ms() - marker.at
if age < 0 then age = 0 end
return {age, marker.token}
