-- extend_lease.lua: push a claim's lease out to server now + lease; fenced by the claim token.
--
-- KEYS[1]  <prefix>:{tag}:state    hash: id -> state JSON
-- KEYS[2]  <prefix>:{tag}:leases   zset: leased ids by lease_until (ms)
-- ARGV[1]  message id
-- ARGV[2]  claim token
-- ARGV[3]  lease in milliseconds
--
-- Returns  {"OK", lease_until}  the new lease end, ms since the epoch (server clock, TIME)
-- Codes    {"TAKEN"}    processing under another claim token
--          {"MISSING"}  unknown id or not in processing
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return {'MISSING'}
end
local st = cjson.decode(raw)
if st.s ~= 'processing' then
  return {'MISSING'}
end
if st.f ~= ARGV[2] then
  return {'TAKEN'}
end
local t = redis.call('TIME')
st.l = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], st.l, ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(st))
return {'OK', st.l}
