-- complete.lua: fenced finish of a claim; only the holder of the claim token may move it.
--
-- KEYS[1]  <prefix>:{tag}:state           hash: id -> state JSON
-- KEYS[2]  <prefix>:{tag}:leases          zset: leased ids by lease_until
-- KEYS[3]  <prefix>:{tag}:body            hash: id -> body JSON
-- KEYS[4]  <prefix>:{tag}:q:processing    zset: the processing index
-- KEYS[5]  <prefix>:{tag}:q:<target>      zset: the index of the target status
-- ARGV[1]  message id
-- ARGV[2]  target status (the caller checked it is allowed from processing)
-- ARGV[3]  claim token
--
-- Returns  {"OK", body JSON, state JSON}      finished; the token stays recorded
--          {"REPLAY", body JSON, state JSON}  this token already finished it with this status
-- Codes    {"TAKEN"}    processing under another claim token
--          {"MISSING"}  unknown id, or not in processing (requeued, finished by someone else)
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return {'MISSING'}
end
local st = cjson.decode(raw)
if st.s ~= 'processing' then
  if st.f == ARGV[3] and st.s == ARGV[2] then
    return {'REPLAY', redis.call('HGET', KEYS[3], ARGV[1]), raw}
  end
  return {'MISSING'}
end
if st.f ~= ARGV[3] then
  return {'TAKEN'}
end
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[5], st.q, ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
st.w = nil
st.l = nil
st.s = ARGV[2]
local enc = cjson.encode(st)
redis.call('HSET', KEYS[1], ARGV[1], enc)
return {'OK', redis.call('HGET', KEYS[3], ARGV[1]), enc}
