--[[
Pushback: the supplier refused or failed a call; record it for the whole fleet, in one
round trip. gateway_limiter/model/pushback.py is the same model in Python and explains it;
in short, the state (KEYS[1], four packed doubles) is

  until  no call of the interface goes before this moment (the server's clock; 0: none)
  f      the effective rate as a fraction of the row's rate, as of `since`
  since  when f was set (the last decrease); f recovers by RECOVERY_PER_US per µs
  rate   the row's rate f was recorded under (another rate makes f void)

and the decision scripts (bucket.lua, limits.lua) read it in the call that decides.

KEYS[1]  where the state lives: for an interface that is one bucket, the bucket's own key
         (the state follows its five doubles, see bucket.lua); for a bucket with a
         calendar quota beside it, the quota's key (after the count and the bucket's
         five); for any other, <prefix>:{<interfaceUrl>}:pb[:<caller>], under the
         limits' hash tag
ARGV[1]  the row's rate as the decision scripts are told it (their first limit's)
ARGV[2]  retry_after in microseconds, or "" for none (a multiplicative decrease)
ARGV[3]  now in microseconds, or "" for the server's TIME (tests drive the clock)
ARGV[4]  "1": KEYS[1] is a bucket's key; "2": a calendar quota's, the bucket's after the
         count (two doubles, four paced; a key without one gets a count of none, period
         0, which every reader takes for no count); "0": a key of its own. In a bucket's
         or a quota's key the key's expiry is kept, or made longer: never shortened, so
         the count outlives its period as the decision scripts set it

Returns one string of two little-endian doubles (as bucket.lua's reply): the factor
after it, and next free (µs from now before which no call goes; 0: none).
]]

local DECREASE, FLOOR, WINDOW_US = 0.5, 0.1, 1000000
local RECOVERY_PER_US = 0.05 / 1000000

local rate = tonumber(ARGV[1])
local now
if ARGV[3] == "" then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[3])
end

local in_bucket = ARGV[4] ~= "0"
local until_at, f, since, old_rate = 0, 1, now, rate
local bucket, px = nil, 0  -- the bucket's five doubles, and how long the key must last
local count = ""  -- in a quota's key: its count, kept as it is
local saved = redis.pcall("GET", KEYS[1])
if type(saved) ~= "string" then saved = "" end
if ARGV[4] == "2" then
  local n, c = #saved, 0
  if n == 16 or n == 56 or n == 88 then c = 16 elseif n == 32 or n == 72 or n == 104 then c = 32 end
  if c > 0 then
    count = string.sub(saved, 1, c)
    saved = string.sub(saved, c + 1)
    px = redis.call("PTTL", KEYS[1])
  else
    count = struct.pack("<dd", 0, 0)
    saved = ""
  end
end
if in_bucket and (#saved == 40 or #saved == 72) then
  bucket = string.sub(saved, 1, 40)
  px = redis.call("PTTL", KEYS[1])
  saved = string.sub(saved, 41)
end
if #saved == 32 then
  until_at, f, since, old_rate = struct.unpack("<dddd", saved)
end
if old_rate ~= rate then f, since = 1, now end  -- the row's rate changed: f is void

local current = math.min(1, f + math.max(0, now - since) * RECOVERY_PER_US)
if ARGV[2] ~= "" then
  until_at = math.max(until_at, now + tonumber(ARGV[2]))
elseif current >= 1 or now - since >= WINDOW_US then  -- one burst of refusals counts once
  f = math.max(FLOOR, current * DECREASE)
  since = now
  current = f
end

local recovered = since + (1 - f) / RECOVERY_PER_US
local value = struct.pack("<dddd", until_at, f, since, rate)
px = math.max(px, 1, math.ceil((math.max(until_at, recovered) - now) / 1000) + 1000)
if in_bucket then  -- no bucket state: -1 stored permits says so (a full bucket)
  value = count .. (bucket or struct.pack("<ddddd", -1, 0, 0, 0, 0)) .. value
end
redis.call("SET", KEYS[1], value, "PX", px)
return struct.pack("<dd", current, math.max(0, until_at - now))
