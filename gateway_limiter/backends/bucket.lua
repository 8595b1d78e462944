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
ARGV[1]  the row's bucket, three little-endian doubles (struct "<ddd", packed once per row
         by backends/scripts.py, bucket_config): rate (permits per second, > 0),
         capacity (> 0; ignored for warm-up, which derives it from the rate and W), and
         the warm-up period W in microseconds (0 = a token bucket). Unpacked in one call:
         parsing three numbers from text costs more server time than the arithmetic.
         A fourth double (priority classes, model/priority.py): the share of the
         capacity a call of a class below critical must leave. It goes now, leaving
         that many stored, or is refused with the wait until it could, reserving
         nothing (allowed -1: "reserved", the bucket alone would have admitted it in
         time).
ARGV[2]  permits wanted (>= 1)
ARGV[3]  timeout in microseconds; negative = wait as long as it takes ("0" and "-1",
         the usual two, are recognised without parsing)
ARGV[4]  now in microseconds; absent or "" = the server's TIME (tests drive the clock)
A script that composes this one (lease.lua, slot.lua) may pass ARGV[2-4] as numbers.

A calendar quota beside the bucket (the common pair: a per-second row and a daily one,
both shared or both per caller):
KEYS[1]  the quota's counter (limits.lua's kind 4 or 5 key), holding both: the count
         first (two doubles, four paced, as limits.lua, quota.lua and status read it),
         then the bucket's five, then the pushback's four, each if any
ARGV[1]  nine little-endian doubles (backends/scripts.py, pair_config): the bucket's rate
         and capacity; the quota's permits per period, its boundaries b0..b3 (epoch
         microseconds, as limits.lua takes them) and its burst (0: not paced); a class's
         share of the bucket (-1: none). Its length, 72 bytes, says it is a pair.
The pair is decided exactly as limits.lua decides a token bucket and a calendar quota
(gateway_limiter/model/limits.py, reserve_limits, is the model of both; the property
tests on real Redis pin this script to it; the quota's arithmetic is calendar.lua's,
which backends/scripts.py takes into both scripts; a T past b3 but now is refused
whatever the timeout, as there), all or nothing, and the reply has limits.lua's
three quota doubles after the six. One key read and one written (within a period, one
SETRANGE of the count and the bucket, which keeps the count's expiry) and no table
built: the pair costs little more than the bucket alone (docs/benchmarks.md). The key
lives as long as the count, and longer when the bucket needs it. Why the bucket moved
into the count's key and not the count into the bucket's: every other reader of the
count (limits.lua after a reload adds a row, quota.lua, status, the checkpoints) finds
it where it was, and a Redis holding the old layout goes on from its count; a reload
that parts the pair loses at most the bucket. Token bucket only: a warm-up row stands
alone.

Pushback (pushback.lua) lives in the same key: after the five doubles (beside a calendar
quota: after the count and the five), four more (the
moment before which no call goes, the factor, when it was set, the rate it was set
under). The bucket then runs at the factor times the rate and capacity, and owes until
the moment: no call goes before it, and the bucket is empty then and refills from it. One key,
so a decision still touches one key, and Redis Cluster moves both together (a second
key could be split from the first mid-resharding, and every call would get TRYAGAIN).
A stored value of -1 permits means pushback state alone: no bucket state (full).

Returns one string of six little-endian doubles (struct "<6d"): allowed (1/0), wait in
microseconds, stored permits left, next free, factor, held (microseconds from now until
a pushback's retry_after ends; 0: none). Packed, the caller reads back exactly the
doubles computed here, and neither side formats or parses a number as text (six
"%.17g" strings cost more server time than the bucket's arithmetic). Next free: microseconds from now before which no call can go (the
balance time, plus what the stored permits lack of one permit, at one stable interval
each; in warm-up, plus one stable interval). Only time passing brings it closer, so
until then the process refuses a caller whose timeout cannot reach it without asking.
]]

-- Server time is what caps one Redis core (docs/scaling.md), so this runs as few Lua
-- steps as it can: no closures, no tables built, library functions as locals, the
-- warm-up arithmetic only for warm-up, and a packed reply rather than formatted numbers. No redis.replicate_commands: Redis >= 5
-- replicates a script's writes, not the script, so a write after TIME is allowed
-- (docs/design.md, "Services it needs").
local max, min, pack, unpack = math.max, math.min, struct.pack, struct.unpack

local config = ARGV[1]
local rate, capacity, warmup, qrate, b0, b1, b2, b3, burst, share
if #config == 72 then  -- a calendar quota beside the bucket (see the header)
  rate, capacity, qrate, b0, b1, b2, b3, burst, share = unpack("<ddddddddd", config)
  warmup = 0
  if burst == 0 then burst = nil end  -- not paced
else
  rate, capacity, warmup = unpack("<ddd", config)
end
local permits = ARGV[2]
if permits == "1" then permits = 1 else permits = tonumber(permits) end  -- most calls: no parse
local timeout = ARGV[3]  -- strings are interned: comparing one is comparing a pointer
if timeout == "0" then timeout = 0 elseif timeout == "-1" then timeout = -1 else timeout = tonumber(timeout) end
local now = ARGV[4]
if now == nil or now == "" then
  local t = redis.call("TIME")
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(now)
end

-- pcall: a key of another type (WRONGTYPE, answered as a table: length 0) is not ours
-- either; SET below replaces it. Anything but 40 or 72 bytes: start afresh, as if lost.
local saved = redis.pcall("GET", KEYS[1])
local size = saved and #saved or 0
-- Beside a calendar quota the key is the quota's counter: its count first (two
-- doubles, four paced), then the bucket's five and the pushback's four, each if any.
local base = 0  -- where the bucket's state starts
if qrate then
  if size == 16 or size == 56 or size == 88 then base = 16
  elseif size == 32 or size == 72 or size == 104 then base = 32 end
  size = size - base
end

-- Pushback: the effective rate, and the moment before which no call goes (pushback.lua;
-- a factor recorded under another rate is void: the row changed).
local factor, pushed_until, pushed, pushed_px, held = 1, 0, nil, 0, 0
if size == 72 then
  local RECOVERY_PER_US = 0.05 / 1000000
  pushed = string.sub(saved, base + 41)
  local f, since, pushed_rate
  pushed_until, f, since, pushed_rate = unpack("<dddd", saved, base + 41)
  if pushed_rate == rate then
    factor = min(1, f + max(0, now - since) * RECOVERY_PER_US)
    rate = rate * factor
    capacity = capacity * factor
  end
  local recovered = since + (1 - f) / RECOVERY_PER_US
  pushed_px = math.ceil((max(pushed_until, recovered) - now) / 1000) + 1000
  if pushed_until > now then held = pushed_until - now end  -- how long the hold lasts
end

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

local stored, balance, old_rate, old_capacity, old_refill = -1
if size == 40 or size == 72 then
  stored, balance, old_rate, old_capacity, old_refill = unpack("<ddddd", saved, base + 1)
end
local fresh = stored < 0
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
  stored = min(old_capacity, stored + (now - balance) / old_refill)
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

-- A calendar quota beside the bucket (a 72-byte ARGV[1]; see the header): decided as
-- limits.lua decides a token bucket and a calendar quota, to the last bit (the bucket's
-- arithmetic as limits.lua's kind 1, the quota's in calendar.lua, which both scripts
-- take in), the count, the bucket and its pushback in the quota's key. Token bucket only.
if qrate then
  local ceil, huge = math.ceil, math.huge
  -- 1. each limit's earliest time; T (at) is the latest of them
  local at = now
  if pushed_until > now then at = pushed_until end
  local spend = permits
  if stored < permits then spend = stored end
  local earliest = balance + (permits - spend) * stable  -- balance >= now after the resync
  if earliest > at then at = earliest end
  local window, used, qstored, qbalance, kept, ends
  local beyond  -- past the periods the quota knows (calendar.lua): refused
-- include: calendar.lua, step 1
  if earliest > at then at = earliest end
  -- 2. refuse without writing, or record the call at T in both (3)
  local wait = at - now
  local allowed = 1
  if timeout >= 0 and wait > timeout then allowed = 0 end
  if beyond or (at > b3 and at > now) then allowed = 0 end  -- whatever the budget
  -- more than the quota's period holds, or than a paced quota's bucket ever holds:
  -- refused whatever the wait, with the quota's figures (limits.lua, never)
  local never = permits > qrate or (burst and permits > burst)
  if never then allowed, wait = 0, huge end
  local code = nil
  if share >= 0 and not never then  -- priority classes: the bucket's share
    -- (a quota keeps none)
    local ready = at
    if share > 0 then
      local need = permits + share * capacity
      local t = huge
      if need <= capacity then t = balance + max(0, need - stored) * (1000000 / rate) end
      if t > ready then ready = t end
    elseif permits > capacity then  -- no share, yet more than it holds: never at once
      ready = huge
    end
    if ready > now then
      code = 0  -- reserved when the limits alone admit it, or the class never gets it
      if allowed == 1 or ready == huge then code = -1 end
      allowed, wait = 0, ready - now
    end
  end
  local free, full = now
  if pushed_until > now then free = pushed_until end
  if allowed == 1 then
    if at > balance then
      stored = stored + (at - balance) / stable
      if not (stored < capacity) then stored = capacity end
    end
    stored = stored - permits
    if not (stored > 0) then stored = 0 end
    balance = at
    full = at + (capacity - stored) * stable  -- when the bucket is full again
  end
  earliest = balance
  if stored < 1 then earliest = balance + (1 - stored) * stable end
  if earliest > free then free = earliest end
  local left, reset, expires
  if allowed ~= 1 then at = false end  -- nothing recorded
-- include: calendar.lua, step 3
  if earliest > free then free = earliest end
  if allowed == 1 then
    -- The same period's count in the same form, and a bucket full again before the
    -- key expires (a second after the period ends, set when the period's first call
    -- wrote it, never shortened): the count and the bucket overwritten in place, one
    -- SETRANGE, keeping the expiry and any pushback after them. A SET with PX costs
    -- Redis more than the rest.
    if kept == window and full <= expires then
      if burst then
        redis.call("SETRANGE", KEYS[1], 8, pack("<dddddddd", used, qstored, qbalance, stored, at, rate, capacity, stable))
      else
        redis.call("SETRANGE", KEYS[1], 8, pack("<dddddd", used, stored, at, rate, capacity, stable))
      end
    else  -- a new period (or form): kept as long as any part of it matters
      local value
      if burst then
        value = pack("<ddddddddd", window, used, qstored, qbalance, stored, at, rate, capacity, stable)
      else
        value = pack("<ddddddd", window, used, stored, at, rate, capacity, stable)
      end
      if full > expires then expires = full end
      local px = max(1000, ceil((expires - now) / 1000) + 1000)
      if pushed then
        value = value .. pushed
        if pushed_px > px then px = pushed_px end
      end
      redis.call("SET", KEYS[1], value, "PX", px)
    end
  end
  if code ~= nil then allowed = code end
  return pack("<ddddddddd", allowed, wait, stored, free - now, factor, held, left, reset, qrate)
end

-- 3. spend stored permits first (free in a token bucket; in warm-up, the area under
-- the cost line above the threshold, one stable interval each below it); the
-- shortfall becomes debt
local spend = min(permits, stored)
local cost = (permits - spend) * stable
if warmup > 0 then
  local micros, take, above = 0, spend, stored - threshold
  if above > 0 then
    local part = min(above, take)
    local length = (stable + above * slope) + (stable + (above - part) * slope)
    micros = part * length / 2
    take = take - part
  end
  cost = (micros + stable * take) + cost
end
local start = balance
if now > start then start = now end
local new_balance = start + cost
local wait = new_balance - now

-- the earliest moment (from now) any call could go after this decision, in the order
-- the wait is computed: the balance, plus what the stored permits lack of one permit
-- (in warm-up, one stable interval)
local owed = stable
-- priority classes: a lower class takes no debt, and leaves its share stored
if #ARGV[1] == 32 then
  local share = unpack("<d", ARGV[1], 25)
  local need = permits + share * capacity
  local ready = math.huge
  if need <= capacity then ready = start + max(0, need - stored) * stable end
  if ready > now then
    local code = -1
    -- over the budget: limited, unless the class never gets it (reserved, no wait)
    if timeout >= 0 and wait > timeout and ready < math.huge then code = 0 end
    if warmup <= 0 then owed = max(0, 1 - stored) * stable end
    return pack("<dddddd", code, ready - now, stored, start + owed - now, factor, held)
  end
end
-- 4. refuse without reserving, or reserve
if timeout >= 0 and wait > timeout then
  if warmup <= 0 then owed = max(0, 1 - stored) * stable end
  return pack("<dddddd", 0, wait, stored, start + owed - now, factor, held)
end
stored = stored - spend
if warmup <= 0 then owed = max(0, 1 - stored) * stable end
local px = math.ceil((new_balance + (capacity - stored) * refill - now) / 1000) + 1000
local value = pack("<ddddd", stored, new_balance, rate, capacity, refill)
if pushed then  -- kept as long as either part matters
  value = value .. pushed
  if pushed_px > px then px = pushed_px end
end
redis.call("SET", KEYS[1], value, "PX", px)
return pack("<dddddd", 1, wait, stored, new_balance + owed - now, factor, held)
