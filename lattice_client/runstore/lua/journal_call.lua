-- journal_call.lua: record, before its task message is sent, that a lead tool
-- call sends member work -- once per tool_use_id -- under the segment's lease.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  call journal hash        ...:calls     tool_use_id -> entry JSON
-- ARGV[1]  lease token of the segment
-- ARGV[2]  tool_use_id
-- ARGV[3]  entry JSON ({work_item_id, mailbox_id, member, mode, tool_use_id})
--
-- The journal holds the member calls of the tool batch in progress; it is
-- emptied when the batch's items are registered (add_items.lua). A segment
-- that recovers the batch gets the earlier entry back and reuses its work
-- item instead of sending the task twice.
--
-- returns  the entry already journaled for this tool_use_id, or "" when the
--          given entry was written now
-- errors   "FENCED lead lease lost" when the run is not running under this token
if redis.call('HGET', KEYS[1], 'status') ~= 'running' or redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then
  return redis.error_reply('FENCED lead lease lost')
end
local existing = redis.call('HGET', KEYS[2], ARGV[2])
if existing then
  return existing
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return ''
