-- write_history.lua: append to (or replace) a run's lead history under the
-- segment's lease, so a worker that lost its lease can never write it.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  history list             ...:history   one JSON message per element
-- ARGV[1]  lease token of the segment
-- ARGV[2]  "append" or "replace"
-- ARGV[3]  expiry of the list in milliseconds ("" = none)
-- ARGV[4], ARGV[5], ...  messages (JSON), oldest first
--
-- returns  the list's length afterwards
-- errors   "FENCED lead lease lost" when the run is not running under this token
if redis.call('HGET', KEYS[1], 'status') ~= 'running' or redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then
  return redis.error_reply('FENCED lead lease lost')
end
if ARGV[2] == 'replace' then
  redis.call('DEL', KEYS[2])
end
local chunk = {}
for i = 4, #ARGV do
  chunk[#chunk + 1] = ARGV[i]
  if #chunk == 1000 then
    redis.call('RPUSH', KEYS[2], unpack(chunk))
    chunk = {}
  end
end
if #chunk > 0 then
  redis.call('RPUSH', KEYS[2], unpack(chunk))
end
if ARGV[3] ~= '' and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return redis.call('LLEN', KEYS[2])
