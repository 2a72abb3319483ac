-- clear_items.lua: forget the finished work items of a run (after a resume
-- consumed their outcomes). Unfinished items are kept.
--
-- KEYS[1]  items hash               <prefix>:run:{run:<id>}:items
-- KEYS[2]  registration order list  ...:order
-- KEYS[3]  item state hash          ...:state
-- KEYS[4]  outcomes hash            ...:outcomes
-- KEYS[5]  run record hash          <prefix>:run:{run:<id>}  (for the token check)
-- ARGV[1]  lead lease token of the calling segment ("" or absent = not checked)
--
-- returns  the number of items removed
-- errors   "FENCED lead lease lost" when a token is given and the run is not
--          running under it (nothing removed)
local token = ARGV[1] or ''
if token ~= '' then
  if redis.call('HGET', KEYS[5], 'status') ~= 'running' or redis.call('HGET', KEYS[5], 'lease_token') ~= token then
    return redis.error_reply('FENCED lead lease lost')
  end
end
local ids = redis.call('LRANGE', KEYS[2], 0, -1)
local kept = {}
local removed = 0
for _, id in ipairs(ids) do
  if redis.call('HGET', KEYS[3], id) == 'done' then
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    removed = removed + 1
  else
    kept[#kept + 1] = id
  end
end
if removed > 0 then
  redis.call('DEL', KEYS[2])
  for _, id in ipairs(kept) do
    redis.call('RPUSH', KEYS[2], id)
  end
end
return removed
