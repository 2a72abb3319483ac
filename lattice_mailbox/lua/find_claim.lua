-- find_claim.lua: the message a claim token holds, after a claim_next whose reply was lost.
--
-- KEYS[1]  <prefix>:{tag}:q:processing   zset: processing ids by sequence
-- KEYS[2]  <prefix>:{tag}:body           hash: id -> body JSON
-- KEYS[3]  <prefix>:{tag}:state          hash: id -> state JSON
-- ARGV[1]  the claim token the lost claim_next sent
--
-- Returns  {body JSON, attempts, lease_until} as claim_next.lua does, for the processing
--          message whose claim token is ARGV[1] (the lost claim took effect).
-- Codes    0   no processing message holds that token (the claim did not take effect,
--              or its message moved on since)
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local raw = redis.call('HGET', KEYS[3], id)
  if raw then
    local st = cjson.decode(raw)
    if st.f == ARGV[1] then
      return {redis.call('HGET', KEYS[2], id), st.a, st.l or 0}
    end
  end
end
return 0
