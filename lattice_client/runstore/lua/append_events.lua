-- append_events.lua: append events to a run's event stream, in order.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  event stream             ...:events
-- ARGV[1]  approximate stream length bound (XADD MAXLEN ~)
-- ARGV[2], ARGV[3], ...  event JSONs (objects with a "type"), oldest first
--
-- The stream entries are those append_event.lua writes, one per event.
--
-- returns  the stream entry ids, in order
-- errors   "NORUN run not found" (nothing is appended for an unknown run)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('NORUN run not found')
end
local ids = {}
for i = 2, #ARGV do
  ids[#ids + 1] = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'data', ARGV[i])
end
return ids
