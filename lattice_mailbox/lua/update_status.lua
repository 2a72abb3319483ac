-- update_status.lua: unfenced status change of one message, checked against the state machine.
--
-- KEYS[1]     <prefix>:{tag}:state           hash: id -> state JSON
-- KEYS[2]     <prefix>:{tag}:leases          zset: leased ids by lease_until
-- KEYS[3..9]  <prefix>:{tag}:q:<status>      zsets: ids by sequence, one per status, in ARGV[4] order
-- ARGV[1]     message id
-- ARGV[2]     target status
-- ARGV[3]     statuses the target may be reached from (space separated; the Python table decides)
-- ARGV[4]     the status names of KEYS[3..9], space separated
--
-- Returns  {"OK", state JSON}     moved (leaving processing clears claimed_by, lease_until, token)
--          {"NOOP", state JSON}   already in the target status, nothing written
-- Codes    {"UNKNOWN"}            no such message
--          {"INVALID", current}   the move is refused (nothing written)
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return {'UNKNOWN'}
end
local st = cjson.decode(raw)
if st.s == ARGV[2] then
  return {'NOOP', raw}
end
local allowed = false
for s in string.gmatch(ARGV[3], '%S+') do
  if s == st.s then allowed = true end
end
if not allowed then
  return {'INVALID', st.s}
end
local index = {}
local i = 3
for s in string.gmatch(ARGV[4], '%S+') do
  index[s] = KEYS[i]
  i = i + 1
end
redis.call('ZREM', index[st.s], ARGV[1])
redis.call('ZADD', index[ARGV[2]], st.q, ARGV[1])
if st.s == 'processing' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  st.w = nil
  st.l = nil
end
st.f = nil
st.s = ARGV[2]
local enc = cjson.encode(st)
redis.call('HSET', KEYS[1], ARGV[1], enc)
return {'OK', enc}
