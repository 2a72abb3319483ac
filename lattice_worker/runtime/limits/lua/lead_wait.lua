-- lead_wait.lua: end a lead segment whose model call waits for its turn (shared rate limits):
-- the run goes from "running" to "resuming" under the segment's lease, which it gives up.
--
-- The resume_lead enqueued for the turn (a Celery countdown) starts the next segment from
-- "resuming"; a resume lost with a worker is re-enqueued by the reaper after a lease, and an
-- early one finds the call's held reservation and waits again (lattice_worker.runtime.limits).
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- ARGV[1]  lease token of the segment
-- ARGV[2]  now, milliseconds since the epoch
-- ARGV[3]  when the call's turn comes, ms (Redis server clock), recorded as rate_wait_until
-- ARGV[4]  the limit that made it wait (recorded as rate_wait_limit)
--
-- Record fields written: status, updated_at, lead_attempts (0: the segment ended as a
-- suspension does), rate_wait_until, rate_wait_limit; lease_token and lease_until removed.
--
-- returns  1
-- errors   "FENCED lead lease lost" when the run is not running under this token
if redis.call('HGET', KEYS[1], 'status') ~= 'running' or redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then
  return redis.error_reply('FENCED lead lease lost')
end
redis.call('HSET', KEYS[1], 'status', 'resuming', 'updated_at', ARGV[2], 'lead_attempts', 0,
  'rate_wait_until', ARGV[3], 'rate_wait_limit', ARGV[4])
redis.call('HDEL', KEYS[1], 'lease_token', 'lease_until')
return 1
