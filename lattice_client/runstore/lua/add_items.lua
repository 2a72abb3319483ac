-- add_items.lua: register work items of a run (in order) and dispatch what the
-- per-run concurrency bound allows.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  items hash               ...:items     work_item_id -> item JSON
-- KEYS[3]  registration order list  ...:order     work_item_id, oldest first
-- KEYS[4]  item state hash          ...:state     work_item_id -> queued | dispatched | done
-- KEYS[5]  wait set                 ...:wait      unfinished work_item_ids
-- KEYS[6]  dispatch queue list      ...:queued    registered, not yet dispatched
-- KEYS[7]  active set               ...:active    dispatched, not finished
-- KEYS[8]  call journal hash        ...:calls     (emptied: the batch is registered)
-- ARGV[1]  max_active (integer >= 1): at most this many items dispatched-but-unfinished
-- ARGV[2]  now, milliseconds since the epoch
-- ARGV[3]  lead lease token of the calling segment ("" = not checked)
-- ARGV[4], ARGV[5], ...  pairs: work_item_id, item JSON
--
-- An id already registered is skipped (idempotent re-registration). On a run
-- that is completed, failed or cancelled the items are recorded but nothing is
-- dispatched. With a token, a run that is not finished must be "running" under
-- that token.
--
-- returns  array of the item JSONs dispatched now, in dispatch order
-- errors   "NORUN run not found"
--          "FENCED lead lease lost" when the token does not hold the run (nothing written)
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return redis.error_reply('NORUN run not found')
end
local finished = status == 'completed' or status == 'failed' or status == 'cancelled'
if ARGV[3] ~= '' and not finished then
  if status ~= 'running' or redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[3] then
    return redis.error_reply('FENCED lead lease lost')
  end
end
redis.call('HSET', KEYS[1], 'max_active', ARGV[1], 'updated_at', ARGV[2])
redis.call('DEL', KEYS[8])
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HSETNX', KEYS[2], id, ARGV[i + 1]) == 1 then
    redis.call('RPUSH', KEYS[3], id)
    redis.call('HSET', KEYS[4], id, 'queued')
    redis.call('SADD', KEYS[5], id)
    redis.call('RPUSH', KEYS[6], id)
  end
end
local out = {}
if finished then
  return out
end
local max_active = tonumber(ARGV[1])
while redis.call('SCARD', KEYS[7]) < max_active do
  local id = redis.call('LPOP', KEYS[6])
  if not id then
    break
  end
  redis.call('SADD', KEYS[7], id)
  redis.call('HSET', KEYS[4], id, 'dispatched')
  out[#out + 1] = redis.call('HGET', KEYS[2], id)
end
return out
