-- create.lua: create a run record in status "queued"; never overwrites.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- ARGV[1]  run_id
-- ARGV[2]  team name
-- ARGV[3]  team_ref ("" = none)
-- ARGV[4]  prompt
-- ARGV[5]  now, milliseconds since the epoch
-- ARGV[6]  metadata JSON (an object)
-- ARGV[7]  parent JSON ("" = none)
-- ARGV[8]  token budget ("" or absent = none), a positive integer
--
-- returns  1 = created, 0 = a run with this id already exists (nothing written)
-- errors   none
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1],
  'run_id', ARGV[1], 'team', ARGV[2], 'prompt', ARGV[4], 'status', 'queued',
  'created_at', ARGV[5], 'updated_at', ARGV[5], 'metadata', ARGV[6])
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'team_ref', ARGV[3])
end
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[1], 'parent', ARGV[7])
end
if ARGV[8] and ARGV[8] ~= '' then
  redis.call('HSET', KEYS[1], 'budget_tokens', ARGV[8], 'spent_tokens', 0)
end
return 1
