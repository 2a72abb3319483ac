-- park_lead.lua: suspend a running run whose lead's own tool call waits for a
-- person (a parked call or an approval), under the segment's lead lease.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  the run's open waits     ...:waits   wait id -> JSON
-- ARGV[1]  lease token of the segment
-- ARGV[2]  the wait id
-- ARGV[3]  the wait JSON
-- ARGV[4]  now, milliseconds since the epoch
--
-- The run becomes "suspended" with field "parked" = the wait id; the lead
-- lease is removed and lead_attempts reset (the segment ended, no worker waits).
--
-- returns  1
-- errors   "FENCED lead lease lost" when the run is not running under this token
if redis.call('HGET', KEYS[1], 'status') ~= 'running' or redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then
  return redis.error_reply('FENCED lead lease lost')
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[1], 'status', 'suspended', 'parked', ARGV[2], 'updated_at', ARGV[4], 'lead_attempts', 0)
redis.call('HDEL', KEYS[1], 'lease_token', 'lease_until')
return 1
