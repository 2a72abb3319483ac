-- set_status.lua: move a run to a non-terminal status, optionally compare-and-set.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- ARGV[1]  new status (queued | running | suspended | resuming)
-- ARGV[2]  expected current status ("" = any)
-- ARGV[3]  now, milliseconds since the epoch
--
-- returns  1 = status set; 0 = refused: unknown run, current status differs from
--          the expected one, or the run is already completed/failed/cancelled
--          (terminal statuses are only written by finish.lua and cancel.lua)
-- errors   none
local current = redis.call('HGET', KEYS[1], 'status')
if not current then
  return 0
end
if ARGV[2] ~= '' and current ~= ARGV[2] then
  return 0
end
if current == 'completed' or current == 'failed' or current == 'cancelled' then
  return 0
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'updated_at', ARGV[3])
return 1
