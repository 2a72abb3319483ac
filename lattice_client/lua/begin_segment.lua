-- begin_segment.lua: start a lead segment of a run: move it from the expected
-- status to "running" under a new lead lease, and count the attempt.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- ARGV[1]  expected current status (queued | resuming)
-- ARGV[2]  lease token (unique per segment)
-- ARGV[3]  lease_until, milliseconds since the epoch
-- ARGV[4]  now, milliseconds since the epoch
--
-- Record fields written: status, lease_token, lease_until, updated_at;
-- lead_attempts is incremented (segment starts since the last suspension or
-- since submission); the "recover" flag (set by recover_lead.lua) is returned
-- and removed.
--
-- returns  {1, attempts, recover}: started (recover = "1" when the segment
--          must rebuild its state from the persisted history, else "0");
--          {0}: refused, the run is missing or not in the expected status
-- errors   none
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= ARGV[1] then
  return {0}
end
redis.call('HSET', KEYS[1], 'status', 'running', 'lease_token', ARGV[2], 'lease_until', ARGV[3],
  'updated_at', ARGV[4])
local attempts = redis.call('HINCRBY', KEYS[1], 'lead_attempts', 1)
local recover = redis.call('HGET', KEYS[1], 'recover') or '0'
redis.call('HDEL', KEYS[1], 'recover')
return {1, attempts, recover}
