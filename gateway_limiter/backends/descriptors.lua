--[[
Several interfaces decided together, all or nothing, in one round trip: what Envoy's
rate limit service (gateway_limiter/rls/) sends when one request's descriptors name
more than one limited interface (or caller).

This file is not a script on its own: backends/scripts.py composes it after the two
decision scripts wrapped as functions, as for slot.lua,

    local function rate_bucket(KEYS, ARGV) <bucket.lua> end
    local function rate_limits(KEYS, ARGV) <limits.lua> end
    <this file>

so each interface is decided by exactly the script, keys and arguments a Python
caller's decision sends (its algorithms, periods, channel cap, pushbacks), one after
the other: an interface decided later sees what an earlier one took (two descriptors
of one channel both count against its cap). If any of them refuses, every key this
call names is put back as it was before the call (DUMP before, RESTORE or DEL after):
nothing is taken, and no other client can see the state in between (a script runs
alone). The keys of several interfaces lie in several Redis Cluster slots, so this
script runs on one Redis (or a Sentinel's master); on a cluster the service decides
interfaces one by one (docs/envoy.md).

KEYS     every decision's keys, in order
ARGV[1]  n, the number of decisions; then for each: "bucket" or "limits", how many of
         KEYS are its own, how many arguments follow, and its arguments (as
         backends/scripts.py's Commands builds them)

Returns one little-endian double, 1 if every decision admitted (and took its permits)
or 0 (nothing taken), followed by each decision's own reply, as its script answers
(six doubles; nine from limits.lua for an interface with a calendar quota), each after
one double that counts its doubles (a decision that admitted before another refused has
been undone).
]]

local RATE = {bucket = rate_bucket, limits = rate_limits}
local n = tonumber(ARGV[1])

-- Before anything is taken: every key as it is (false: no such key), once each.
local before = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  if before[key] == nil then
    local dumped = redis.call("DUMP", key)
    if dumped then
      before[key] = {dumped, redis.call("PTTL", key)}
    else
      before[key] = false
    end
  end
end

local replies, all = {}, 1
local at, first = 2, 1
for i = 1, n do
  local script, nkeys, nargs = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local keys, args = {}, {}
  for j = 1, nkeys do keys[j] = KEYS[first + j - 1] end
  for j = 1, nargs do args[j] = ARGV[at + 2 + j] end
  first, at = first + nkeys, at + 3 + nargs
  local reply = RATE[script](keys, args)
  if struct.unpack("<d", reply) ~= 1 then all = 0 end
  replies[i] = struct.pack("<d", #reply / 8) .. reply  -- its length: 6 or 9 doubles
end

if all == 0 then  -- all or nothing: put every key back
  for key, was in pairs(before) do
    if was then
      local ttl = was[2]
      if ttl < 0 then ttl = 0 end  -- -1: no expiry
      redis.call("RESTORE", key, ttl, was[1], "REPLACE")
    else
      redis.call("DEL", key)
    end
  end
end
return struct.pack("<d", all) .. table.concat(replies)
