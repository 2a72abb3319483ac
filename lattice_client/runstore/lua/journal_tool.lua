-- journal_tool.lua: record the lead's own tool calls (started / completed)
-- under the segment's lead lease.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  the lead's tool journal  ...:tools   tool_use_id -> call record JSON,
--                                               "approval:<tool_use_id>" -> decision JSON
-- ARGV[1]  lease token of the segment
-- ARGV[2]  expiry of the journal in milliseconds
-- ARGV[3], ARGV[4] ...  field, value pairs to set
--
-- returns  the number of fields set
-- errors   "FENCED lead lease lost" when the run is not running under this token
if redis.call('HGET', KEYS[1], 'status') ~= 'running' or redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then
  return redis.error_reply('FENCED lead lease lost')
end
local n = 0
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  n = n + 1
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return n
