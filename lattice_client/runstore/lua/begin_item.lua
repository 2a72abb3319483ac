-- begin_item.lua: start a member's attempt at one work item of a run: take the
-- item's journal for this claim and read what the member persisted so far.
--
-- KEYS[1]  the item's tool journal hash   <prefix>:run:{run:<id>}:item:<work_item_id>:journal
--          fields: tool_use_id -> call record JSON, "approval:<tool_use_id>" -> decision JSON,
--          "~fence" -> "<claim attempts> <claim token>", "~waiting" -> open wait id
-- KEYS[2]  the item's history list        ...:item:<work_item_id>:history (one JSON message each)
-- KEYS[3]  the run's open waits hash      <prefix>:run:{run:<id>}:waits   (wait id -> JSON)
-- ARGV[1]  the claim's attempts (the mailbox counts claims: a later claim has more)
-- ARGV[2]  the claim token
-- ARGV[3]  expiry of the item's keys in milliseconds
--
-- The fence makes the item's writes this claim's: a worker holding an older
-- claim (fewer attempts) is refused from now on (see write_item.lua). A wait this item had open
-- (a parked call or an approval) that a person has decided is closed here.
--
-- returns  {history elements (oldest first), journal as a flat field/value list}
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
local waiting = redis.call('HGET', KEYS[1], '~waiting')
if waiting then
  local raw = redis.call('HGET', KEYS[3], waiting)
  local decided = true
  if raw then
    local entry = cjson.decode(raw)
    decided = entry.resolution ~= nil and entry.resolution ~= cjson.null
  end
  if decided then
    redis.call('HDEL', KEYS[3], waiting)
    redis.call('HDEL', KEYS[1], '~waiting')
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return {redis.call('LRANGE', KEYS[2], 0, -1), redis.call('HGETALL', KEYS[1])}
