-- complete_item.lua: record the outcome of one work item (idempotent), dispatch
-- the next queued items the bound allows, and wake the run when this was the
-- last item it waited for.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  items hash               ...:items
-- KEYS[3]  item state hash          ...:state
-- KEYS[4]  outcomes hash            ...:outcomes  work_item_id -> outcome JSON
-- KEYS[5]  wait set                 ...:wait
-- KEYS[6]  dispatch queue list      ...:queued
-- KEYS[7]  active set               ...:active
-- ARGV[1]  work_item_id
-- ARGV[2]  outcome JSON
-- ARGV[3]  now, milliseconds since the epoch
--
-- Resume rule: when this completion empties the wait set while the run is
-- "suspended", the run moves to "resuming" and resume = 1. Because suspend.lua
-- and this script are atomic against each other, exactly one of them sees the
-- empty wait set: no wake-up is lost or doubled.
--
-- returns  {recorded, resume, run status, item JSON dispatched now...}
--          recorded = 0 when the item is unknown (or cleared) or already done:
--          then nothing changed and resume = 0, no dispatch
--          run status: the run's status afterwards ("" when the run is gone)
-- errors   none
local state = redis.call('HGET', KEYS[3], ARGV[1])
if (not state) or state == 'done' then
  return {0, 0, redis.call('HGET', KEYS[1], 'status') or ''}
end
redis.call('HSET', KEYS[3], ARGV[1], 'done')
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
redis.call('SREM', KEYS[5], ARGV[1])
redis.call('SREM', KEYS[7], ARGV[1])
if state == 'queued' then
  redis.call('LREM', KEYS[6], 1, ARGV[1])
end
local status = redis.call('HGET', KEYS[1], 'status')
local out = {1, 0, status or ''}
if not status then
  return out
end
redis.call('HSET', KEYS[1], 'updated_at', ARGV[3])
if status == 'completed' or status == 'failed' or status == 'cancelled' then
  return out
end
local max_active = tonumber(redis.call('HGET', KEYS[1], 'max_active') or '1')
while redis.call('SCARD', KEYS[7]) < max_active do
  local id = redis.call('LPOP', KEYS[6])
  if not id then
    break
  end
  redis.call('SADD', KEYS[7], id)
  redis.call('HSET', KEYS[3], id, 'dispatched')
  out[#out + 1] = redis.call('HGET', KEYS[2], id)
end
if status == 'suspended' and redis.call('SCARD', KEYS[5]) == 0 then
  redis.call('HSET', KEYS[1], 'status', 'resuming')
  out[2] = 1
  out[3] = 'resuming'
end
return out
