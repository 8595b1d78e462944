--[[
Every limit of one interface, decided together, all or nothing, in one round trip
(also a single sliding or fixed window). reserve_limits() in gateway_limiter/model/limits.py
is the same model in Python and explains it at length; in short:

  1. each limit says the earliest time it could let the call go: a token bucket once
     its debt and the call's shortfall are paid (bucket.lua's steps 1-3, without
     warm-up); a sliding window its earliest slot (no window of its length holds more
     than its rate); a fixed window now if the current window has room, else the
     start of the next window (never an earlier one than already given out);
  2. the call goes at the latest of these times, T. If T - now exceeds the caller's
     timeout: refuse, and write nothing to any limit;
  3. otherwise every limit records the call at T: a bucket refills up to T, then
     gives the permits (its balance time becomes T); a sliding window appends T; a
     fixed window counts the permits in the window that contains T. Each key expires
     once its state no longer matters.

Recording at T rather than at a limit's own earliest time keeps every limit exact: a
limit that could have served sooner must not count the call before it really goes.
All keys carry the interface's {hash tag}, so on Redis Cluster they share one slot.

KEYS[i]  limit i's state: a bucket as in bucket.lua (five packed doubles); a sliding
         window as the list of its admission times; a fixed window as two packed
         doubles: k and the permits reserved in window [k P, (k + 1) P)
KEYS[n]  (the last key) the interface's pushback state (pushback.lua): token buckets run
         at its factor times their rate and capacity, windows count at most their rate
         times it (whole permits, at least the call's), and no call goes before its moment
ARGV[1]  permits wanted (>= 1)
ARGV[2]  timeout in microseconds; negative = wait as long as it takes
ARGV[3]  now in microseconds, or "" for the server's TIME (tests drive the clock)
ARGV[3i+1], ARGV[3i+2], ARGV[3i+3]  limit i: kind, rate, size, one of
         "tb"  permits per second, capacity
         "sw"  permits per window, window length in microseconds
         "fw"  permits per window, period P in microseconds
ARGV[3n+4] (optional) how many limits are the interface's own; the rest are its channel's
         (a channel cap, shared with other interfaces: the interface's pushback neither
         scales nor delays them, though the call still goes no sooner than its moment)

Returns {allowed (1/0), wait in microseconds, the least stored permits of the buckets
(0 without one), next free, the pushback factor, held (microseconds from now until a
pushback's retry_after ends; 0: none)}, numbers with 17 significant digits, like bucket.lua. Next
free: microseconds from now before which no call can go, the latest of each limit's
earliest time for one permit after this decision (only time passing brings it
closer). A window that can never hold the permits wanted refuses with wait "inf"
(and next free 0: not every limit was read).
]]

if redis.replicate_commands then
  -- Redis < 5 needs this before a write that follows TIME; later versions ignore it.
  pcall(redis.replicate_commands)
end

local permits = tonumber(ARGV[1])
local timeout = tonumber(ARGV[2])
local now
if ARGV[3] == "" then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[3])
end

local function num(x) return string.format("%.17g", x) end

-- Pushback, as in bucket.lua: the last key; its factor is void under another rate than
-- the first limit's (the row changed).
local RECOVERY_PER_US = 0.05 / 1000000
local nlimits = #KEYS - 1
local factor, pushed_until = 1, 0
local pushed = redis.pcall("GET", KEYS[#KEYS])
if type(pushed) == "string" and #pushed == 32 then
  local f, since, pushed_rate
  pushed_until, f, since, pushed_rate = struct.unpack("<dddd", pushed)
  if pushed_rate == tonumber(ARGV[5]) then
    factor = math.min(1, f + math.max(0, now - since) * RECOVERY_PER_US)
  end
end

local held = "0"  -- the reply says how long a pushback's hold lasts
if pushed_until > now then held = num(pushed_until - now) end

-- A key holding anything else than its kind's state (another type, another length) is
-- lost state, as in bucket.lua: read with pcall, start afresh, replace it on a write.

-- 1. each limit's earliest time; T (at) is the latest of them
local kinds, rates, sizes, states, foreign = {}, {}, {}, {}, {}
local at = math.max(now, pushed_until)
local own = tonumber(ARGV[3 * nlimits + 4]) or nlimits  -- capacity shares: see ARGV[3n+4]
for i = 1, nlimits do
  local factor, pushed_until = factor, pushed_until  -- capacity shares: a channel's limit
  if i > own then factor, pushed_until = 1, 0 end    -- is not this interface's to push
  local kind, rate, size = ARGV[3 * i + 1], tonumber(ARGV[3 * i + 2]), tonumber(ARGV[3 * i + 3])
  -- Pushback slows every limit: a bucket's rate and capacity, a window's count (cap),
  -- in whole permits and at least this call's (else it could never go). next_free and
  -- the trim keep the window's own rate: the factor only recovers.
  local cap = rate
  if factor ~= 1 then
    if kind == "tb" then
      rate, size = rate * factor, size * factor
    else
      cap = math.max(permits, math.floor(rate * factor))
    end
  end
  kinds[i], rates[i], sizes[i] = kind, rate, size
  local earliest
  if kind == "tb" then
    local stable = 1000000 / rate
    local saved = redis.pcall("GET", KEYS[i])
    local stored, balance, old_rate, old_capacity, old_refill
    if type(saved) == "string" and #saved == 40 then
      stored, balance, old_rate, old_capacity, old_refill = struct.unpack("<ddddd", saved)
    else  -- no state: full and in balance
      stored, balance, old_rate, old_capacity, old_refill = size, now, rate, size, stable
      saved = nil
    end
    if pushed_until > 0 and (saved == nil or balance < pushed_until) then
      stored, balance = 0, pushed_until  -- a hold drains the bucket (bucket.lua)
    end
    if now > balance then  -- resync at the refill rate the state was built with
      stored = math.min(old_capacity, stored + (now - balance) / old_refill)
      balance = now
    end
    if old_rate ~= rate or old_capacity ~= size or old_refill ~= stable then
      if old_capacity > 0 then  -- a config change rescales stored permits, keeps debt
        stored = stored * size / old_capacity
      else
        stored = size
      end
    end
    local spend = math.min(permits, stored)
    earliest = math.max(balance, now) + (permits - spend) * stable
    states[i] = {stored, balance}
  elseif permits > rate then
    return {0, "inf", "0", "0", num(factor), held}
  elseif kind == "sw" then
    earliest = now
    local count = redis.pcall("LLEN", KEYS[i])
    if type(count) ~= "number" then  -- not a list: an empty window, the key replaced
      count, foreign[i] = 0, true
    end
    if count > 0 then
      earliest = math.max(earliest, tonumber(redis.call("LINDEX", KEYS[i], -1)))
    end
    local need = count + permits - cap  -- admissions that must have left the window
    if need > 0 then
      earliest = math.max(earliest, tonumber(redis.call("LINDEX", KEYS[i], need - 1)) + size)
    end
  else  -- "fw"
    local window, used = math.floor(now / size), 0
    local saved = redis.pcall("GET", KEYS[i])
    if type(saved) == "string" and #saved == 16 then
      local w, u = struct.unpack("<dd", saved)
      if w >= window then window, used = w, u end
    end
    local first = window
    if used + permits > cap then first = window + 1 end
    earliest = math.max(now, first * size)
    states[i] = {window, used}  -- not moved on: step 3 does that, and a refusal keeps it
  end
  at = math.max(at, earliest)
end

-- The earliest moment (from now) any call could go, after the decision: every limit's
-- earliest time for one permit (sliding windows: their admission times, in KEYS).
local function next_free()
  local free = math.max(now, pushed_until)
  for i = 1, nlimits do
    local kind, rate, size, earliest = kinds[i], rates[i], sizes[i], now
    if kind == "tb" then
      local stored, balance = states[i][1], states[i][2]
      earliest = math.max(balance, now) + math.max(0, 1 - stored) * (1000000 / rate)
    elseif kind == "sw" then
      local count = redis.pcall("LLEN", KEYS[i])
      if type(count) ~= "number" then count = 0 end
      if count > 0 then
        earliest = math.max(earliest, tonumber(redis.call("LINDEX", KEYS[i], -1)))
      end
      if count + 1 > rate then
        earliest = math.max(earliest, tonumber(redis.call("LINDEX", KEYS[i], count - rate)) + size)
      end
    else
      local window, used = states[i][1], states[i][2]
      if used + 1 > rate then
        earliest = (window + 1) * size
      else
        earliest = math.max(now, window * size)
      end
    end
    free = math.max(free, earliest)
  end
  return num(free - now)
end

-- 2. refuse without writing anything, or ...
local wait = at - now
local least = nil
if timeout >= 0 and wait > timeout then
  for i = 1, nlimits do
    if kinds[i] == "tb" and (least == nil or states[i][1] < least) then least = states[i][1] end
  end
  return {0, num(wait), num(least or 0), next_free(), num(factor), held}
end

-- 3. ... record the call at T in every limit
for i = 1, nlimits do
  local kind, rate, size = kinds[i], rates[i], sizes[i]
  if kind == "tb" then
    local stable = 1000000 / rate
    local stored, balance = states[i][1], states[i][2]
    if at > balance then
      stored = math.min(size, stored + (at - balance) / stable)
    end
    stored = math.max(0, stored - permits)
    local full_at = math.max(at, now) + (size - stored) * stable
    redis.call("SET", KEYS[i], struct.pack("<ddddd", stored, at, rate, size, stable),
      "PX", math.ceil((full_at - now) / 1000) + 1000)
    if least == nil or stored < least then least = stored end
    states[i] = {stored, at}
  elseif kind == "sw" then
    local slot = num(at)
    if foreign[i] then redis.call("DEL", KEYS[i]) end
    for _ = 1, permits do
      redis.call("RPUSH", KEYS[i], slot)
    end
    redis.call("LTRIM", KEYS[i], -rate, -1)
    redis.call("PEXPIRE", KEYS[i], math.ceil((at + size - now) / 1000) + 1000)
  else
    local window, used = states[i][1], states[i][2]
    local w = math.floor(at / size)
    if w > window then window, used = w, 0 end
    used = used + permits
    redis.call("SET", KEYS[i], struct.pack("<dd", window, used),
      "PX", math.ceil(((window + 1) * size - now) / 1000) + 1000)
    states[i] = {window, used}
  end
end
return {1, num(wait), num(least or 0), next_free(), num(factor), held}
