-- append_events_fenced.lua: append events to a run's event stream, in order,
-- only while the writer still holds what it writes for: its lead segment's
-- lease on the run, or its member claim on one work item of the run.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  event stream             ...:events
-- KEYS[3]  the fence's hash: the run record again (ARGV[2] = "lead") or the
--          item's tool journal hash ...:item:<work_item_id>:journal (ARGV[2] = "item")
-- ARGV[1]  approximate stream length bound (XADD MAXLEN ~)
-- ARGV[2]  the fence: "lead" or "item"
-- ARGV[3]  lead: the segment's lease token; item: the claim's attempts
-- ARGV[4]  item: the claim token (lead: ignored)
-- ARGV[5]  item: expiry of the item's keys in milliseconds (lead: ignored)
-- ARGV[6], ARGV[7], ...  event JSONs (objects with a "type"), oldest first
--
-- Lead fence: the run must be "running" under the token (as write_history.lua).
-- Item fence: the item's "~fence" as in write_item.lua: a claim with more
-- attempts takes it over, the same attempts must carry the same token, fewer
-- attempts are refused. The check and the appends are one atomic step; the
-- stream entries are those append_events.lua writes.
--
-- returns  the stream entry ids, in order
-- errors   "NORUN run not found" (nothing is appended for an unknown run)
--          "FENCED lead lease lost" / "FENCED item claimed again" (nothing appended)
--          "BADFENCE <kind>" for another ARGV[2]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('NORUN run not found')
end
if ARGV[2] == 'lead' then
  if redis.call('HGET', KEYS[3], 'status') ~= 'running' or redis.call('HGET', KEYS[3], 'lease_token') ~= ARGV[3] then
    return redis.error_reply('FENCED lead lease lost')
  end
elseif ARGV[2] == 'item' then
  local fence = redis.call('HGET', KEYS[3], '~fence')
  local mine = ARGV[3] .. ' ' .. ARGV[4]
  if fence ~= mine then
    if fence then
      local attempts, token = string.match(fence, '^(%d+) (.*)$')
      attempts = tonumber(attempts)
      if attempts > tonumber(ARGV[3]) or (attempts == tonumber(ARGV[3]) and token ~= ARGV[4]) then
        return redis.error_reply('FENCED item claimed again')
      end
    end
    redis.call('HSET', KEYS[3], '~fence', mine)
    redis.call('PEXPIRE', KEYS[3], ARGV[5])
  end
else
  return redis.error_reply('BADFENCE ' .. tostring(ARGV[2]))
end
local ids = {}
for i = 6, #ARGV do
  ids[#ids + 1] = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'data', ARGV[i])
end
return ids
