-- cancel.lua: cancel a run unless it already finished; list its unfinished
-- work items so the caller can cancel their mailbox messages.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  event stream             ...:events
-- KEYS[3]  registration order list  ...:order
-- KEYS[4]  item state hash          ...:state
-- KEYS[5]  items hash               ...:items
-- KEYS[6]  dispatch queue list      ...:queued
-- KEYS[7]  result stream            ...:result (gets the run_result event too)
-- ARGV[1]  RunResult JSON (status "cancelled")
-- ARGV[2]  run_result event JSON
-- ARGV[3]  approximate stream length bound (XADD MAXLEN ~)
-- ARGV[4]  now, milliseconds since the epoch
--
-- A second cancel changes nothing and appends no event, but lists the
-- unfinished items again (so a caller can retry cancelling their messages).
--
-- returns  {changed, item JSON...}: changed = 1 when the run became cancelled
--          now, 0 when it was already cancelled (items listed) or already
--          completed/failed (no items listed)
-- errors   "NORUN run not found"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return redis.error_reply('NORUN run not found')
end
if status == 'completed' or status == 'failed' then
  return {0}
end
local out = {0}
if status ~= 'cancelled' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'result', ARGV[1], 'updated_at', ARGV[4])
  redis.call('DEL', KEYS[6])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'data', ARGV[2])
  redis.call('XADD', KEYS[7], '*', 'data', ARGV[2])
  out[1] = 1
end
for _, id in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  if redis.call('HGET', KEYS[4], id) ~= 'done' then
    out[#out + 1] = redis.call('HGET', KEYS[5], id)
  end
end
return out
