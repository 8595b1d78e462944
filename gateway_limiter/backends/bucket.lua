--[[
The bucket: one decision, atomically, in one round trip. gateway_limiter/model/bucket.py is
the same model in Python and explains it at length; in short:

  config (ARGV, from the row): rate r permits/s (stable interval = 1e6 / r
         microseconds per permit), capacity C (most permits that can be saved up),
         warm-up period W (microseconds; 0 = a plain token bucket);
  state  (KEYS[1], a string of five little-endian doubles, packed by struct): s =
         stored permits, b = balance time (microseconds on the server's clock: when
         the bucket next owes nothing), r, c, k = the rate, capacity and refill
         interval the state was built with.

  1. resync: past the balance time, elapsed time adds stored permits (one per refill
     interval, up to C);
  2. a config change rescales stored permits to the new capacity; debt (b) stays;
  3. the reservation spends stored permits first (free in a token bucket; in warm-up,
     each costs between 1 and 3 stable intervals, the fuller the dearer); the
     shortfall costs one stable interval per permit. b moves forward by the total
     cost, and the caller waits until that new b;
  4. if that wait exceeds the caller's timeout, refuse and write nothing;
     otherwise store the new state and let the key expire once the bucket would be
     full again (from then on, no state and a full bucket are the same thing).

Why one packed string and not a hash: the state is read with one GET and written with
one SET ... PX (value and expiry together), and doubles go in and out exactly without
formatting or parsing text. That is less than half the server time of HMGET + HSET of
five formatted fields + PEXPIRE, on the call every gateway request waits for.

KEYS[1]  the bucket's state
ARGV[1]  rate (permits per second, > 0)
ARGV[2]  capacity (> 0; ignored for warm-up, which derives it from the rate and W)
ARGV[3]  permits wanted (>= 1)
ARGV[4]  timeout in microseconds; negative = wait as long as it takes
ARGV[5]  now in microseconds; absent or "" = the server's TIME (tests drive the clock)
ARGV[6]  warm-up period W in microseconds; absent or "0" = a token bucket

Pushback (pushback.lua) lives in the same key: after the five doubles, four more (the
moment before which no call goes, the factor, when it was set, the rate it was set
under). The bucket then runs at the factor times the rate and capacity, and owes until
the moment: no call goes before it, and the bucket is empty then and refills from it. One key,
so a decision still touches one key, and Redis Cluster moves both together (a second
key could be split from the first mid-resharding, and every call would get TRYAGAIN).
A stored value of -1 permits means pushback state alone: no bucket state (full).

Returns {allowed (1/0), wait in microseconds, stored permits left, next free, factor,
held (microseconds from now until a pushback's retry_after ends; 0: none)}, numbers
as strings with 17 significant digits so the caller reads back exactly the doubles
computed here. Next free: microseconds from now before which no call can go (the
balance time, plus what the stored permits lack of one permit, at one stable interval
each; in warm-up, plus one stable interval). Only time passing brings it closer, so
until then the process refuses a caller whose timeout cannot reach it without asking.
]]

if redis.replicate_commands then
  -- Redis < 5 needs this before a write that follows TIME; later versions ignore it.
  pcall(redis.replicate_commands)
end

local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local permits = tonumber(ARGV[3])
local timeout = tonumber(ARGV[4])
local warmup = tonumber(ARGV[6] or "0")
local now
if ARGV[5] == nil or ARGV[5] == "" then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[5])
end

local function num(x) return string.format("%.17g", x) end

-- pcall: a key of another type (WRONGTYPE) is not ours either; SET below replaces it.
local saved = redis.pcall("GET", KEYS[1])
if type(saved) ~= "string" or (#saved ~= 40 and #saved ~= 72) then
  saved = nil  -- anything else: start afresh, as if lost
end

-- Pushback: the effective rate, and the moment before which no call goes (pushback.lua;
-- a factor recorded under another rate is void: the row changed).
local RECOVERY_PER_US = 0.05 / 1000000
local factor, pushed_until, pushed, pushed_px = 1, 0, nil, 0
if saved and #saved == 72 then
  pushed = string.sub(saved, 41)
  local f, since, pushed_rate
  pushed_until, f, since, pushed_rate = struct.unpack("<dddd", pushed)
  if pushed_rate == rate then
    factor = math.min(1, f + math.max(0, now - since) * RECOVERY_PER_US)
  end
  local recovered = since + (1 - f) / RECOVERY_PER_US
  pushed_px = math.ceil((math.max(pushed_until, recovered) - now) / 1000) + 1000
end
rate = rate * factor
capacity = capacity * factor
local held = "0"  -- the reply says how long a pushback's hold lasts
if pushed_until > now then held = num(pushed_until - now) end

-- The shape of the bucket: how fast stored permits come back, and what they cost.
local stable = 1000000 / rate
local refill, threshold, slope = stable, capacity, 0
if warmup > 0 then
  local cold = stable * 3
  threshold = 0.5 * warmup / stable
  capacity = threshold + 2 * warmup / (stable + cold)
  slope = (cold - stable) / (capacity - threshold)
  refill = warmup / capacity
end

local function stored_cost(stored, take)
  if warmup <= 0 then return 0 end
  local micros = 0
  local above = stored - threshold
  if above > 0 then
    local part = math.min(above, take)
    local length = (stable + above * slope) + (stable + (above - part) * slope)
    micros = part * length / 2
    take = take - part
  end
  return micros + stable * take
end

local stored, balance, old_rate, old_capacity, old_refill
if saved then
  stored, balance, old_rate, old_capacity, old_refill = struct.unpack("<ddddd", saved)
end
local fresh = saved == nil or stored < 0
if fresh then
  -- No state: a bucket left alone for long, full and in balance.
  stored, balance = capacity, now
  old_rate, old_capacity, old_refill = rate, capacity, refill
end
-- A hold drains the bucket: empty at its end, refilled from there, so permits saved
-- before it do not burst out when it ends. A balance before the hold's end means no
-- decision has absorbed it yet; no state counts as drained too (model: bucket.held).
if pushed_until > 0 and (fresh or balance < pushed_until) then
  stored, balance = 0, pushed_until
end

-- 1. resync at the refill rate the state was built with
if now > balance then
  stored = math.min(old_capacity, stored + (now - balance) / old_refill)
  balance = now
end

-- 2. a config change keeps the bucket: rescale stored permits, keep the debt
if old_rate ~= rate or old_capacity ~= capacity or old_refill ~= refill then
  if old_capacity > 0 then
    stored = stored * capacity / old_capacity
  else
    stored = capacity
  end
end

-- 3. spend stored permits first; the shortfall becomes debt
local spend = math.min(permits, stored)
local shortfall = permits - spend
local cost = stored_cost(stored, spend) + shortfall * stable
local new_balance = math.max(balance, now) + cost
local wait = new_balance - now

-- the earliest moment (from now) any call could go after this decision
local function next_free(s, b)
  local owed
  if warmup > 0 then owed = stable else owed = math.max(0, 1 - s) * stable end
  return num(math.max(b, now) + owed - now)  -- in the order the wait is computed
end

-- 4. refuse without reserving, or reserve
if timeout >= 0 and wait > timeout then
  return {0, num(wait), num(stored), next_free(stored, balance), num(factor), held}
end
stored = stored - spend
local full_at = math.max(new_balance, now) + (capacity - stored) * refill
local value = struct.pack("<ddddd", stored, new_balance, rate, capacity, refill)
local px = math.ceil((full_at - now) / 1000) + 1000
if pushed then  -- kept as long as either part matters
  value, px = value .. pushed, math.max(px, pushed_px)
end
redis.call("SET", KEYS[1], value, "PX", px)
return {1, num(wait), num(stored), next_free(stored, new_balance), num(factor), held}
