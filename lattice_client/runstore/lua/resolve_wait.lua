-- resolve_wait.lua: record a person's decision on an open wait (a parked call
-- or an approval) of a run, in the tool journal that the work reads when it
-- resumes.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  the run's open waits     ...:waits   wait id -> JSON
-- KEYS[3]  the tool journal the decision goes to (the item's ...:item:<id>:journal,
--          or the lead's ...:tools)
-- ARGV[1]  the wait id
-- ARGV[2]  the kind of wait expected: "parked" or "approval"
-- ARGV[3]  the journal field to change
-- ARGV[4]  "set" (ARGV[5] becomes its value) or "del" (the field is removed)
-- ARGV[5]  the value JSON ("" with "del")
-- ARGV[6]  the resolution JSON (recorded on the wait)
-- ARGV[7]  now, milliseconds since the epoch
--
-- A lead's wait (the record's "parked" field names it) is closed at once and the
-- run moves "suspended" -> "resuming" with the recover flag (the caller sends
-- lattice.resume_lead). A member's wait stays, marked resolved, until the member
-- begins again (begin_item.lua), so a decision whose message could not be moved
-- back to pending can be given again.
--
-- returns  {"OK", wait JSON}          recorded now
--          {"RESOLVED", wait JSON}    already decided earlier (its "resolution" says how); nothing changed
-- errors   "NOWAIT no such wait"      no open wait with this id
--          "WRONGKIND <kind>"         the wait is of the other kind; nothing changed
--          "BADSTATE <status>"        a lead's wait whose run is not suspended on it; nothing changed
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then
  return redis.error_reply('NOWAIT no such wait')
end
local entry = cjson.decode(raw)
if entry.kind ~= ARGV[2] then
  return redis.error_reply('WRONGKIND ' .. tostring(entry.kind))
end
if entry.resolution ~= nil and entry.resolution ~= cjson.null then
  return {'RESOLVED', raw}
end
local lead = redis.call('HGET', KEYS[1], 'parked') == ARGV[1]
if entry.message_id == nil or entry.message_id == cjson.null then
  local status = redis.call('HGET', KEYS[1], 'status') or 'missing'
  if not lead or status ~= 'suspended' then
    return redis.error_reply('BADSTATE ' .. status)
  end
end
if ARGV[4] == 'set' then
  redis.call('HSET', KEYS[3], ARGV[3], ARGV[5])
else
  redis.call('HDEL', KEYS[3], ARGV[3])
end
entry.resolution = cjson.decode(ARGV[6])
local enc = cjson.encode(entry)
if lead then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('HSET', KEYS[1], 'status', 'resuming', 'recover', '1', 'updated_at', ARGV[7])
  redis.call('HDEL', KEYS[1], 'parked')
else
  redis.call('HSET', KEYS[2], ARGV[1], enc)
end
return {'OK', enc}
