-- finish.lua: store a run's final result and append its "run_result" event,
-- once.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  event stream             ...:events
-- KEYS[3]  result stream            ...:result (gets the run_result event too;
--                                   what a waiter blocks on)
-- ARGV[1]  final status (completed | failed)
-- ARGV[2]  RunResult JSON
-- ARGV[3]  run_result event JSON
-- ARGV[4]  approximate stream length bound (XADD MAXLEN ~)
-- ARGV[5]  now, milliseconds since the epoch
-- ARGV[6]  lead lease token of the calling segment ("" or absent = not checked)
--
-- Finishing removes the lead lease.
--
-- returns  1 = finished now; 0 = refused, the run was already completed, failed
--          or cancelled (nothing written)
-- errors   "NORUN run not found"
--          "FENCED lead lease lost" when a token is given and the run is not
--          running under it (nothing written)
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return redis.error_reply('NORUN run not found')
end
if status == 'completed' or status == 'failed' or status == 'cancelled' then
  return 0
end
local token = ARGV[6] or ''
if token ~= '' and (status ~= 'running' or redis.call('HGET', KEYS[1], 'lease_token') ~= token) then
  return redis.error_reply('FENCED lead lease lost')
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'result', ARGV[2], 'updated_at', ARGV[5])
redis.call('HDEL', KEYS[1], 'lease_token', 'lease_until')
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'data', ARGV[3])
redis.call('XADD', KEYS[3], '*', 'data', ARGV[3])
return 1
