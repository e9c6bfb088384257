"""The Lua scripts of the Redis store (proxy/ops/redis_store.py has the layout of the keys).
Each runs in one round trip, atomically; none changes anything unless it answers that it did.

The write script runs without `allow-oom`: with `maxmemory-policy noeviction` (docs/store.md)
a full Redis refuses it before it changes anything, and the write is counted `full`. The read
and delete scripts are flagged `allow-oom`: a read only renews expiries and a delete only
frees memory, so both go on working when Redis is full. The `#!lua` lines need Redis 7.0 or
later, as `PEXPIRE ... GT` does.
"""

from __future__ import annotations

READ = """#!lua flags=allow-oom
-- KEYS[1]: the response; ARGV: the record prefix, the shared-value prefix, the renewed TTL in
-- ms (ttl_seconds and its half again), the longest walk.
-- Returns {} when it is not stored, or deleted, or a link of its chain or a value it shares
-- is missing (evicted, deleted); else {response object, n, then n pairs of (hash, value): the
-- values its own record shares, then its segment, meta and parent's id ('' at the start),
-- its parent's, ... to the start}.
-- Every record read and every value they share lives at least that long from now (GT: an
-- expiry is never shortened), so a shared value never expires before a record using it.
local key, prefix, bprefix, ttl = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local first = redis.call('HMGET', key, 'r', 'd', 'b')
if not first[1] or first[2] then return {} end
local out, renewed = {first[1], 0}, {}
for h in string.gmatch(first[3] or '', '%S+') do
  local value = redis.call('HGET', bprefix .. h, 'v')
  if not value then return {} end
  out[#out + 1] = h
  out[#out + 1] = value
  out[2] = out[2] + 1
end
for _ = 1, tonumber(ARGV[4]) do
  local link = redis.call('HMGET', key, 's', 'm', 'p', 'b', 'd')
  if not link[2] or link[5] then return {} end
  redis.call('PEXPIRE', key, ttl, 'GT')
  for h in string.gmatch(link[4] or '', '%S+') do
    if not renewed[h] then
      renewed[h] = true
      redis.call('PEXPIRE', bprefix .. h, ttl, 'GT')
    end
  end
  out[#out + 1] = link[1]
  out[#out + 1] = link[2]
  out[#out + 1] = link[3] or ''
  if not link[3] or link[3] == '' then return out end
  key = prefix .. link[3]
end
return {}
"""

WRITE = """#!lua
-- KEYS[1]: the new response; ARGV: the record prefix, the shared-value prefix, the renewed
-- TTL in ms, ttl_seconds in ms, the deepest chain, the longest walk, the new id, its parent's
-- id ('' none), the ids it may be registered under, nearest first, one a line ('' none: it
-- goes under the first that Redis holds), segment, meta, response object,
-- then a (hash, value) pair per value it shares (value '' when the writer believes Redis
-- holds it already).
-- Returns 'ok', or with nothing changed: 'exists' (the id is taken, by a record or a
-- tombstone), 'deleted' (what it continues was deleted), 'no_parent', 'too_deep', or
-- 'no_blob' (a value sent as '' is not there: send it again with its bytes).
-- No record outlives its parent: the new one takes its parent's expiry, and only when that
-- is less than ttl_seconds away is the chain walked and renewed (GT, up to the first link
-- renewed already), which happens once per half TTL of a chain however many writes it has.
-- A shared value's expiry is raised to the latest of its records'.
local key, prefix, bprefix = KEYS[1], ARGV[1], ARGV[2]
local renew, least = tonumber(ARGV[3]), tonumber(ARGV[4])
local rid, parent = ARGV[7], ARGV[8]
if redis.call('EXISTS', key) == 1 then return 'exists' end
local unders = {}
for u in string.gmatch(ARGV[9], '[^\\n]+') do
  if redis.call('HEXISTS', prefix .. u, 'd') == 1 then return 'deleted' end
  unders[#unders + 1] = prefix .. u
end
local depth, expiry, walk = 1, renew, false
if parent ~= '' then
  local pkey = prefix .. parent
  local left = redis.call('PTTL', pkey)
  if left == -2 then return 'no_parent' end
  depth = (tonumber(redis.call('HGET', pkey, 'n')) or 1) + 1
  if depth > tonumber(ARGV[5]) then return 'too_deep' end
  if left >= 0 and left < least then
    walk = true
  elseif left >= 0 then
    expiry = left
  end
end
local refs = {}
for i = 13, #ARGV, 2 do
  if ARGV[i + 1] == '' and redis.call('EXISTS', bprefix .. ARGV[i]) == 0 then
    return 'no_blob'
  end
  refs[#refs + 1] = ARGV[i]
end
if walk then
  local at, renewed = parent, {}
  for _ = 1, tonumber(ARGV[6]) do
    if at == '' then break end
    local k = prefix .. at
    if redis.call('PEXPIRE', k, renew, 'GT') == 0 then break end
    local link = redis.call('HMGET', k, 'p', 'b')
    for h in string.gmatch(link[2] or '', '%S+') do
      if not renewed[h] then
        renewed[h] = true
        redis.call('PEXPIRE', bprefix .. h, renew, 'GT')
      end
    end
    at = link[1] or ''
  end
end
redis.call('HSET', key, 'p', parent, 's', ARGV[10], 'm', ARGV[11], 'r', ARGV[12], 'n', depth,
  'b', table.concat(refs, ' '))
redis.call('PEXPIRE', key, expiry)
for _, ukey in ipairs(unders) do
  if redis.call('EXISTS', ukey) == 1 then
    redis.call('HSET', ukey, '>' .. rid, '')
    -- a chain's start keeps an expiry of its own: it may outlive the nearest, so it goes
    -- under every one Redis holds; a link never outlives its parent, the first
    if parent ~= '' then break end
  end
end
for i = 13, #ARGV, 2 do
  local bkey = bprefix .. ARGV[i]
  if redis.call('EXISTS', bkey) == 0 then redis.call('HSET', bkey, 'v', ARGV[i + 1]) end
  redis.call('HSET', bkey, '.' .. rid, '')
  if redis.call('PTTL', bkey) == -1 then
    redis.call('PEXPIRE', bkey, expiry)
  else
    redis.call('PEXPIRE', bkey, expiry, 'GT')
  end
end
return 'ok'
"""

DELETE = """#!lua flags=allow-oom
-- KEYS[1]: the owner's set of responses waiting to be deleted; ARGV: the record prefix, the
-- shared-value prefix, the tombstones' TTL in ms, the most waiting responses to delete now,
-- the response DELETE names ('' none: only go on with those waiting).
-- Deletes that response, then up to that many waiting ones. Deleting a record replaces it
-- with a tombstone ('d') and adds the records registered under it (its '>' fields) to the
-- waiting set; a value it shared goes when no live record uses it any more.
-- Returns {1 if the response named was stored and now is deleted, else 0; how many wait}.
local pending, prefix, bprefix = KEYS[1], ARGV[1], ARGV[2]
local tomb, limit, rid = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local touched, found = {}, 0

local function gone(id)
  local k = prefix .. id
  if redis.call('HEXISTS', k, 'm') == 0 then return end  -- not there, or a tombstone
  for _, field in ipairs(redis.call('HKEYS', k)) do
    if string.sub(field, 1, 1) == '>' then redis.call('SADD', pending, string.sub(field, 2)) end
  end
  for h in string.gmatch(redis.call('HGET', k, 'b') or '', '%S+') do
    redis.call('HDEL', bprefix .. h, '.' .. id)
    touched[h] = true
  end
  redis.call('DEL', k)
  redis.call('HSET', k, 'd', '1')
  redis.call('PEXPIRE', k, tomb)
end

if rid ~= '' then
  local k = prefix .. rid
  if redis.call('HEXISTS', k, 'r') == 1 and redis.call('HEXISTS', k, 'd') == 0 then
    found = 1
  end
  gone(rid)
end
local done = 0
while done < limit do  -- what it deletes adds to the set: take from it again
  local batch = redis.call('SPOP', pending, limit - done)
  if #batch == 0 then break end
  for _, id in ipairs(batch) do gone(id) end
  done = done + #batch
end
-- a shared value with no live record left goes (users that expired are dropped on the way)
for h in pairs(touched) do
  local bkey = bprefix .. h
  while true do
    if redis.call('HLEN', bkey) <= 1 then
      redis.call('DEL', bkey)
      break
    end
    local live = false
    for _, field in ipairs(redis.call('HRANDFIELD', bkey, 8)) do
      if field ~= 'v' then
        if redis.call('HEXISTS', prefix .. string.sub(field, 2), 'm') == 1 then
          live = true
          break
        end
        redis.call('HDEL', bkey, field)
      end
    end
    if live then break end
  end
end
if redis.call('EXISTS', pending) == 1 then redis.call('PEXPIRE', pending, tomb) end
return {found, redis.call('SCARD', pending)}
"""
