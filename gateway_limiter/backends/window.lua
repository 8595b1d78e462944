--[[
The sliding window: no window of one second (plus a guard of a few milliseconds for
wake-up jitter) ever holds more than r admissions, across every process. The model
and its explanation are decide_window() in gateway_limiter/bucket.py.

  state (KEYS[1], a list): the times of the last r admissions (microseconds on the
        server's clock), oldest first; some may lie in the future (reserved slots).

A call of n permits is placed at the earliest t >= now, not before the latest
admission (callers keep their order), such that with it no window ending at t holds
more than r: if n more would exceed r, t is at least one window after the admission
that must drop out. Wait until t if within the timeout; otherwise refuse, writing
nothing. The list is trimmed to r entries, so memory is bounded by the rate.

KEYS[1]  the window's list
ARGV[1]  rate r (admissions per window, >= 1)
ARGV[2]  permits wanted n (1..r)
ARGV[3]  timeout in microseconds; negative = wait as long as it takes
ARGV[4]  now in microseconds, or "" for the server's TIME
ARGV[5]  window length in microseconds

Returns {allowed (1/0), wait in microseconds, 0} like bucket.lua.
]]

if redis.replicate_commands then
  pcall(redis.replicate_commands)
end

local rate = tonumber(ARGV[1])
local permits = tonumber(ARGV[2])
local timeout = tonumber(ARGV[3])
local window = tonumber(ARGV[5])
local now
if ARGV[4] == "" then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[4])
end

local function num(x) return string.format("%.17g", x) end

if permits > rate then
  return {0, "inf", "0"}
end

local at = now
local count = redis.call("LLEN", KEYS[1])
if count > 0 then
  at = math.max(at, tonumber(redis.call("LINDEX", KEYS[1], -1)))
end
local need = count + permits - rate -- admissions that must have left the window
if need > 0 then
  at = math.max(at, tonumber(redis.call("LINDEX", KEYS[1], need - 1)) + window)
end

local wait = at - now
if timeout >= 0 and wait > timeout then
  return {0, num(wait), "0"}
end
local slot = num(at)
for _ = 1, permits do
  redis.call("RPUSH", KEYS[1], slot)
end
redis.call("LTRIM", KEYS[1], -rate, -1)
redis.call("PEXPIRE", KEYS[1], math.ceil((at + window - now) / 1000) + 1000)
return {1, num(wait), "0"}
