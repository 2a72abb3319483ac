-- recover_lead.lua: take over a running run whose lead lease expired (its
-- worker died or stalled): re-enqueue it for a recovering resume, or fail it
-- when its attempts are used up. The caller decides which after reading the
-- record; this script only acts when the record is still what it read.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  event stream             ...:events
-- KEYS[3]  result stream            ...:result (gets the run_result event too)
-- ARGV[1]  the lease token the caller read ("" = the record had none)
-- ARGV[2]  now, milliseconds since the epoch
-- ARGV[3]  action: "requeue" or "fail"
-- ARGV[4]  RunResult JSON (status "failed"; action "fail" only)
-- ARGV[5]  run_result event JSON (action "fail" only)
-- ARGV[6]  approximate stream length bound (XADD MAXLEN ~)
--
-- "requeue": status -> "resuming", recover flag set, lease removed (the stale
-- worker's token no longer matches: its writes are refused). "fail": status
-- -> "failed" with the result, run_result event appended, lease removed.
--
-- returns  0 = nothing done (not running, another token, or the lease has not
--          expired); 1 = requeued; 2 = failed
-- errors   none
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return 0
end
local token = redis.call('HGET', KEYS[1], 'lease_token') or ''
if token ~= ARGV[1] then
  return 0
end
local lease_until = tonumber(redis.call('HGET', KEYS[1], 'lease_until') or '0') or 0
if lease_until > tonumber(ARGV[2]) then
  return 0
end
redis.call('HDEL', KEYS[1], 'lease_token', 'lease_until')
if ARGV[3] == 'fail' then
  redis.call('HSET', KEYS[1], 'status', 'failed', 'result', ARGV[4], 'updated_at', ARGV[2])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'data', ARGV[5])
  redis.call('XADD', KEYS[3], '*', 'data', ARGV[5])
  return 2
end
redis.call('HSET', KEYS[1], 'status', 'resuming', 'recover', '1', 'updated_at', ARGV[2])
return 1
