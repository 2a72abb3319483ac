-- inbox.lua: a consistent, oldest-first listing of one mailbox for one status or for all of them.
--
-- KEYS[1]     <prefix>:{tag}:name         string: the mailbox id owning this tag
-- KEYS[2]     <prefix>:{tag}:body         hash: id -> body JSON
-- KEYS[3]     <prefix>:{tag}:state        hash: id -> state JSON
-- KEYS[4..]   <prefix>:{tag}:q:<status>   one zset (a single status) or all seven ("all")
-- ARGV[1]     mailbox id (must own the tag)
-- ARGV[2]     limit, or "" for no limit
--
-- Returns  {id1, body JSON 1, state JSON 1, id2, ...} ordered by send sequence
-- Codes    none (an unknown mailbox gives an empty list)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {}
end
local limit = -1
if ARGV[2] ~= '' then
  limit = tonumber(ARGV[2])
end
local ids
if #KEYS == 4 then
  local stop = -1
  if limit > 0 then
    stop = limit - 1
  end
  ids = redis.call('ZRANGE', KEYS[4], 0, stop)
else
  local args = {'ZUNION', #KEYS - 3}
  for i = 4, #KEYS do
    args[#args + 1] = KEYS[i]
  end
  ids = redis.call(unpack(args))
end
local out = {}
for i, id in ipairs(ids) do
  if limit >= 0 and i > limit then
    break
  end
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[2], id)
  out[#out + 1] = redis.call('HGET', KEYS[3], id)
end
return out
