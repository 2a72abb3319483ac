-- requeue_expired.lua: return one mailbox's expired claims to pending (or failed past max attempts).
--
-- KEYS[1]  <prefix>:{tag}:leases          zset: leased ids by lease_until (ms)
-- KEYS[2]  <prefix>:{tag}:state           hash: id -> state JSON
-- KEYS[3]  <prefix>:{tag}:body            hash: id -> body JSON
-- KEYS[4]  <prefix>:{tag}:q:processing    zset
-- KEYS[5]  <prefix>:{tag}:q:pending       zset
-- KEYS[6]  <prefix>:{tag}:q:failed        zset
-- ARGV[1]  now in ms, or "" for the server clock (TIME); a lease is expired when lease_until <= now
-- ARGV[2]  max attempts, or "" for none: a message whose claims expired that many times fails
--          (state field x counts the expired claims; a claim handed back on purpose -- parked
--          then resolved, released to wait for a turn -- does not count, though a: attempts does)
-- ARGV[3]  batch size (at most this many moved per call; call again while a full batch comes back)
--
-- Returns  {id1, body JSON 1, state JSON 1, id2, ...}  the moved messages with their new state
-- Codes    none
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local max_attempts = nil
if ARGV[2] ~= '' then
  max_attempts = tonumber(ARGV[2])
end
local out = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local raw = redis.call('HGET', KEYS[2], id)
  if raw then
    local st = cjson.decode(raw)
    if st.s == 'processing' then
      redis.call('ZREM', KEYS[4], id)
      st.x = (st.x or 0) + 1
      if max_attempts and st.x >= max_attempts then
        st.s = 'failed'
        redis.call('ZADD', KEYS[6], st.q, id)
      else
        st.s = 'pending'
        redis.call('ZADD', KEYS[5], st.q, id)
      end
      st.w = nil
      st.l = nil
      st.f = nil
      local enc = cjson.encode(st)
      redis.call('HSET', KEYS[2], id, enc)
      out[#out + 1] = id
      out[#out + 1] = redis.call('HGET', KEYS[3], id)
      out[#out + 1] = enc
    end
  end
end
return out
