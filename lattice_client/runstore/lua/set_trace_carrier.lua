-- set_trace_carrier.lua: keep the trace carrier of a run (the propagation
-- headers of its trace root) in the run record, under the segment's lease.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- ARGV[1]  lease token of the segment
-- ARGV[2]  the carrier, a JSON object of strings ("{}" when the tracers
--          propagate nothing: the root exists all the same)
--
-- Record field written: trace_carrier (never overwritten: the first segment's
-- root is the run's root).
--
-- returns  1 = written; 0 = the record already has one (nothing written)
-- errors   "FENCED lead lease lost" when the run is not running under this token
if redis.call('HGET', KEYS[1], 'status') ~= 'running' or redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then
  return redis.error_reply('FENCED lead lease lost')
end
return redis.call('HSETNX', KEYS[1], 'trace_carrier', ARGV[2])
