-- append_event.lua: append one event to a run's event stream.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  event stream             ...:events
-- ARGV[1]  approximate stream length bound (XADD MAXLEN ~)
-- ARGV[2]  event JSON (an object with a "type")
--
-- returns  the stream entry id
-- errors   "NORUN run not found" (no stream is created for an unknown run)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('NORUN run not found')
end
return redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'data', ARGV[2])
