-- write_item.lua: a member's writes to one work item under its claim: history
-- messages appended (or the history replaced), then tool journal fields set.
--
-- KEYS[1]  the item's tool journal hash   ...:item:<work_item_id>:journal (see begin_item.lua)
-- KEYS[2]  the item's history list        ...:item:<work_item_id>:history
-- ARGV[1]  the claim's attempts
-- ARGV[2]  the claim token
-- ARGV[3]  expiry of the item's keys in milliseconds
-- ARGV[4]  "append" or "replace" (the history)
-- ARGV[5]  n, the number of history messages that follow
-- ARGV[6 .. 5+n]            history messages (JSON), oldest first
-- ARGV[6+n], ARGV[7+n] ...  journal field, value pairs (call records, approval decisions)
--
-- Fence: the item's "~fence" names the claim that writes it. A claim with more
-- attempts takes it over (the first attempt needs no begin_item); the same
-- attempts must carry the same token; fewer attempts are refused.
--
-- returns  the history list's length afterwards
-- errors   "FENCED item claimed again" when a later claim holds the item
local fence = redis.call('HGET', KEYS[1], '~fence')
if fence then
  local attempts, token = string.match(fence, '^(%d+) (.*)$')
  attempts = tonumber(attempts)
  if attempts > tonumber(ARGV[1]) or (attempts == tonumber(ARGV[1]) and token ~= ARGV[2]) then
    return redis.error_reply('FENCED item claimed again')
  end
end
redis.call('HSET', KEYS[1], '~fence', ARGV[1] .. ' ' .. ARGV[2])
if ARGV[4] == 'replace' then
  redis.call('DEL', KEYS[2])
end
local n = tonumber(ARGV[5])
local chunk = {}
for i = 6, 5 + n do
  chunk[#chunk + 1] = ARGV[i]
  if #chunk == 1000 then
    redis.call('RPUSH', KEYS[2], unpack(chunk))
    chunk = {}
  end
end
if #chunk > 0 then
  redis.call('RPUSH', KEYS[2], unpack(chunk))
end
for i = 6 + n, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return redis.call('LLEN', KEYS[2])
