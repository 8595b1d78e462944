--[[
The bucket: one decision, atomically, in one round trip. gateway_limiter/bucket.py is
the same model in Python and explains it at length; in short:

  config (ARGV, from the row): rate r permits/s (interval = 1e6 / r microseconds per
         permit), capacity C (most permits that can be saved up);
  state  (KEYS[1], a hash): s = stored permits, b = balance time (microseconds on the
         server's clock: when the bucket next owes nothing), r and c = the config the
         state was built with.

  1. resync: past the balance time, elapsed time adds stored permits (up to C);
  2. a config change rescales stored permits to the new capacity; debt (b) stays;
  3. the reservation spends stored permits first; the shortfall is debt: b moves
     forward by shortfall * interval, and the caller waits until that new b;
  4. if that wait exceeds the caller's timeout, refuse and write nothing;
     otherwise store the new state and let the key expire once the bucket would be
     full again (from then on, no state and a full bucket are the same thing).

KEYS[1]  the bucket's hash
ARGV[1]  rate (permits per second, > 0)
ARGV[2]  capacity (> 0)
ARGV[3]  permits wanted (>= 1)
ARGV[4]  timeout in microseconds; negative = wait as long as it takes
ARGV[5]  now in microseconds, or "" for the server's TIME (tests drive the clock)

Returns {allowed (1/0), wait in microseconds, stored permits left}, numbers as strings
with 17 significant digits so the caller reads back exactly the doubles computed here.
]]

if redis.replicate_commands then
  -- Redis < 5 needs this before a write that follows TIME; later versions ignore it.
  pcall(redis.replicate_commands)
end

local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local permits = tonumber(ARGV[3])
local timeout = tonumber(ARGV[4])
local now
if ARGV[5] == "" then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[5])
end

local function num(x) return string.format("%.17g", x) end

local saved = redis.call("HMGET", KEYS[1], "s", "b", "r", "c")
local stored, balance, old_rate, old_capacity
if saved[1] then
  stored, balance = tonumber(saved[1]), tonumber(saved[2])
  old_rate, old_capacity = tonumber(saved[3]), tonumber(saved[4])
else
  -- No state: a bucket left alone for long, full and in balance.
  stored, balance, old_rate, old_capacity = capacity, now, rate, capacity
end

-- 1. resync at the rate the state was built with
if now > balance then
  local old_interval = 1000000 / old_rate
  stored = math.min(old_capacity, stored + (now - balance) / old_interval)
  balance = now
end

-- 2. a rate change keeps the bucket: rescale stored permits, keep the debt
if old_rate ~= rate or old_capacity ~= capacity then
  if old_capacity > 0 then
    stored = stored * capacity / old_capacity
  else
    stored = capacity
  end
end

-- 3. spend stored permits first; the shortfall becomes debt
local interval = 1000000 / rate
local spend = math.min(permits, stored)
local shortfall = permits - spend
local new_balance = math.max(balance, now) + shortfall * interval
local wait = new_balance - now

-- 4. refuse without reserving, or reserve
if timeout >= 0 and wait > timeout then
  return {0, num(wait), num(stored)}
end
stored = stored - spend
redis.call("HSET", KEYS[1], "s", num(stored), "b", num(new_balance), "r", num(rate), "c", num(capacity))
local full_at = math.max(new_balance, now) + (capacity - stored) * interval
redis.call("PEXPIRE", KEYS[1], math.ceil((full_at - now) / 1000) + 1000)
return {1, num(wait), num(stored)}
