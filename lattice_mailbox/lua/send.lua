-- send.lua: append one pending message to a mailbox (atomic: all or nothing).
--
-- KEYS[1]  <prefix>:{tag}:name        string: the mailbox id owning this tag
-- KEYS[2]  <prefix>:{tag}:seq         counter: send sequence (FIFO order)
-- KEYS[3]  <prefix>:{tag}:body        hash: message id -> body JSON (immutable fields)
-- KEYS[4]  <prefix>:{tag}:state       hash: message id -> state JSON {s, q, a[, w, l, f]}
-- KEYS[5]  <prefix>:{tag}:q:pending   zset: pending message ids scored by sequence
-- ARGV[1]  mailbox id
-- ARGV[2]  message id
-- ARGV[3]  body JSON (written verbatim, never decoded here)
--
-- Returns  {"OK", seq}
-- Codes    {"COLLISION", owner}  another mailbox id already owns this hash tag (nothing written)
--          {"DUPLICATE"}         the message id exists already (nothing written)
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then
  return {'COLLISION', owner}
end
if redis.call('HEXISTS', KEYS[4], ARGV[2]) == 1 then
  return {'DUPLICATE'}
end
if not owner then
  redis.call('SET', KEYS[1], ARGV[1])
end
local seq = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[4], ARGV[2], cjson.encode({s = 'pending', q = seq, a = 0}))
redis.call('ZADD', KEYS[5], seq, ARGV[2])
return {'OK', seq}
