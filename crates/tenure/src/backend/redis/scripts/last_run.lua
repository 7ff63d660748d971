-- How long ago the election's last run was recorded, by the server's
-- clock, and the last scheduled slot claimed.
--
-- KEYS[1]  last-run marker hash (fields token, value and maybe slot)
--
-- Returns {} when no run is remembered, else {age_ms, token, slot}: age_ms
-- is 0 if the server's clock stepped back since the record; slot is -1
-- when none was claimed.
-- Errors with "TENUREFOREIGN <key> <what>" on data tenure did not write,
-- and "TENURECMD ..." (prelude).

local marker, err = read_marker(KEYS[1])
if err then return err end
if not marker then
  return {}
end
local age = server_ms() - marker.at
if age < 0 then age = 0 end
return {age, marker.token, marker.slot or -1}
