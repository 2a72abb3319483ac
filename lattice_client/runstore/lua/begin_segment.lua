-- begin_segment.lua: start a lead segment of a run: move it from the expected
-- status to "running" under a new lead lease, and count the attempt; then read
-- what the segment needs (same round trip, same atomic step).
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  the lead's history list  (a key of the run; read when ARGV[5] has "h")
-- KEYS[3]  registration order list  ...:order     (read when ARGV[5] has "i")
-- KEYS[4]  items hash               ...:items     (idem)
-- KEYS[5]  item state hash          ...:state     (idem)
-- KEYS[6]  outcomes hash            ...:outcomes  (idem)
-- KEYS[7]  the worker's usage hash  (a key of the run; read when ARGV[5] has "u")
--          (KEYS[2..7] are optional: only KEYS[1] is needed without reads)
-- ARGV[1]  expected current status (queued | resuming)
-- ARGV[2]  lease token (unique per segment)
-- ARGV[3]  lease_until, milliseconds since the epoch
-- ARGV[4]  now, milliseconds since the epoch
-- ARGV[5]  what to read after the start ("" or absent = nothing): any of
--          "r" (the record), "h" (history), "i" (items), "u" (usage)
--
-- Record fields written: status, lease_token, lease_until, updated_at;
-- lead_attempts is incremented (segment starts since the last suspension or
-- since submission); the "recover" flag (set by recover_lead.lua) is returned
-- and removed.
--
-- returns  {1, attempts, recover, record, history, order, items, state, outcomes, usage}:
--          started (recover = "1" when the segment must rebuild its state from
--          the persisted history, else "0"); record / items / state / outcomes /
--          usage: HGETALL replies (flat field, value lists), history / order:
--          LRANGE replies, each empty when not asked for;
--          {0, status}: refused, the run is not in the expected status (status:
--          the one it is in, "" when the run is missing)
-- errors   none
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= ARGV[1] then
  return {0, status or ''}
end
redis.call('HSET', KEYS[1], 'status', 'running', 'lease_token', ARGV[2], 'lease_until', ARGV[3],
  'updated_at', ARGV[4])
local attempts = redis.call('HINCRBY', KEYS[1], 'lead_attempts', 1)
local recover = redis.call('HGET', KEYS[1], 'recover') or '0'
redis.call('HDEL', KEYS[1], 'recover')
local reads = ARGV[5] or ''
local out = {1, attempts, recover, {}, {}, {}, {}, {}, {}, {}}
if string.find(reads, 'r', 1, true) then
  out[4] = redis.call('HGETALL', KEYS[1])
end
if string.find(reads, 'h', 1, true) then
  out[5] = redis.call('LRANGE', KEYS[2], 0, -1)
end
if string.find(reads, 'i', 1, true) then
  out[6] = redis.call('LRANGE', KEYS[3], 0, -1)
  out[7] = redis.call('HGETALL', KEYS[4])
  out[8] = redis.call('HGETALL', KEYS[5])
  out[9] = redis.call('HGETALL', KEYS[6])
end
if string.find(reads, 'u', 1, true) then
  out[10] = redis.call('HGETALL', KEYS[7])
end
return out
