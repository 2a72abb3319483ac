-- claim_next.lua: move the oldest pending message of one mailbox to processing.
--
-- KEYS[1]  <prefix>:{tag}:name           string: the mailbox id owning this tag
-- KEYS[2]  <prefix>:{tag}:q:pending      zset: pending ids by sequence
-- KEYS[3]  <prefix>:{tag}:q:processing   zset: processing ids by sequence
-- KEYS[4]  <prefix>:{tag}:leases         zset: leased ids by lease_until (ms)
-- KEYS[5]  <prefix>:{tag}:body           hash: id -> body JSON
-- KEYS[6]  <prefix>:{tag}:state          hash: id -> state JSON
-- KEYS[7]  <prefix>:{tag}:q:parked       zset: parked ids (they count as in flight)
-- ARGV[1]  mailbox id (must own the tag)
-- ARGV[2]  lease in milliseconds, or "" for a claim that never expires
-- ARGV[3]  worker id, or ""
-- ARGV[4]  new claim token
-- ARGV[5]  max in flight (processing + parked), or "" for no limit
-- ARGV[6]  the id of the message to claim, or "" (or absent) for the oldest pending one
--
-- Returns  {body JSON (holds the id), attempts, lease_until}  lease_until: ms on the server
--          clock (TIME), 0 for a claim without a lease. The message is now processing, its
--          claimed_by is ARGV[3] and its token ARGV[4]; the full state is in KEYS[6].
--          (A compact reply on purpose: this is the hot path.)
-- Codes    0   nothing pending (or no message was ever sent to this mailbox id; or the
--              message ARGV[6] is not pending in this mailbox)
--          -1  the mailbox already has max-in-flight messages in processing or parked
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[5] ~= '' and redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[7]) >= tonumber(ARGV[5]) then
  return -1
end
local id = ARGV[6] or ''
if id ~= '' then
  if redis.call('ZREM', KEYS[2], id) == 0 then
    return 0
  end
else
  local head = redis.call('ZPOPMIN', KEYS[2])
  if #head == 0 then
    return 0
  end
  id = head[1]
end
local st = cjson.decode(redis.call('HGET', KEYS[6], id))
st.s = 'processing'
st.a = st.a + 1
st.f = ARGV[4]
st.w = nil
if ARGV[3] ~= '' then
  st.w = ARGV[3]
end
st.l = nil
if ARGV[2] ~= '' then
  local t = redis.call('TIME')
  st.l = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
  redis.call('ZADD', KEYS[4], st.l, id)
end
redis.call('ZADD', KEYS[3], st.q, id)
redis.call('HSET', KEYS[6], id, cjson.encode(st))
return {redis.call('HGET', KEYS[5], id), st.a, st.l or 0}
