--[[
A slot: one of an interface's maxConcurrent calls in flight across the fleet, taken
together with the rate permit, in the same script call (one round trip).

This file is not a script on its own: backends/scripts.py composes it after a decision
script (bucket.lua or limits.lua) wrapped as a function,

    local function rate_decision(KEYS, ARGV) <bucket.lua or limits.lua> end
    <this file>

so the rate's semantics stay in bucket.lua and limits.lua alone; this file only decides
whether a slot is free and, if so, asks rate_decision with the caller's own keys and
arguments.

Slots are leases: KEYS[1] is a sorted set of lease ids scored by the moment (ms on the
server's clock) each expires. A live process renews its leases (slot_renew.lua); a dead
one's expire, and every call here first drops the expired ones. So a crash, a lost
release or a Redis restart never leaves a slot counted for longer than a lease.

Fairness: a caller that finds no slot free takes a ticket (KEYS[4], INCR) and waits in
the queue KEYS[2] (sorted by ticket). A caller may take a slot only when fewer than the
free slots are queued ahead of it, so slots go in ticket order across the fleet. A
waiter's place lapses (KEYS[3], by expiry) unless it asks again before ARGV[4] ms: a
dead waiter never holds up the queue for longer than that.

KEYS[1]  leases: lease id -> expiry (ms)
KEYS[2]  queue: lease id -> ticket
KEYS[3]  the queue's lapses: lease id -> when its place lapses (ms)
KEYS[4]  the ticket counter
KEYS[5..] the decision script's keys
ARGV[1]  maxConcurrent
ARGV[2]  lease in ms
ARGV[3]  this call's lease id (also its place in the queue)
ARGV[4]  ms a place in the queue is kept without the waiter asking again (0: no place)
ARGV[5..] the decision script's arguments

Returns {state, in flight after this call, ms, ahead, then the decision script's reply}:
state 1: taken (the rate permit and the slot; wait what the decision says, then go);
state 0: the rate refused (nothing taken, the place in the queue given up);
state 2: no slot free for this caller: it is queued; ms is when the first lease lapses
         (0: none), a moment worth asking again at if no release is announced before;
         ahead: the callers queued before this one (so it need not ask again before
         held + ahead - maxConcurrent + 1 releases).
]]

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max, lease_ms, id, place_ms =
  tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])

-- Keys live as long as what they hold matters (the counter as long as the queue).
local function keep(key, ms)
  if redis.call("PTTL", key) < ms then redis.call("PEXPIRE", key, ms) end
end

redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now_ms)
for _, lapsed in ipairs(redis.call("ZRANGEBYSCORE", KEYS[3], "-inf", now_ms)) do
  redis.call("ZREM", KEYS[2], lapsed)
  redis.call("ZREM", KEYS[3], lapsed)
end

local held = redis.call("ZCARD", KEYS[1])
local ahead = redis.call("ZRANK", KEYS[2], id)
if not ahead then ahead = redis.call("ZCARD", KEYS[2]) end

if held + ahead < max then
  local keys, argv = {}, {}
  for i = 5, #KEYS do keys[#keys + 1] = KEYS[i] end
  for i = 5, #ARGV do argv[#argv + 1] = ARGV[i] end
  local reply = rate_decision(keys, argv)
  redis.call("ZREM", KEYS[2], id)
  redis.call("ZREM", KEYS[3], id)
  local allowed, wait = struct.unpack("<dd", reply)  -- its first doubles (bucket.lua)
  if allowed == 1 then
    -- the lease runs from when the call goes (after its rate wait)
    local until_ms = now_ms + math.ceil(wait / 1000) + lease_ms
    redis.call("ZADD", KEYS[1], until_ms, id)
    keep(KEYS[1], until_ms - now_ms + 1000)
    return {1, held + 1, 0, 0, reply}
  end
  return {0, held, 0, 0, reply}
end

if place_ms > 0 then  -- 0: the caller will not wait, so it takes no place
  if not redis.call("ZSCORE", KEYS[2], id) then
    redis.call("ZADD", KEYS[2], redis.call("INCR", KEYS[4]), id)
  end
  redis.call("ZADD", KEYS[3], now_ms + place_ms, id)
  keep(KEYS[2], place_ms + 1000)
  keep(KEYS[3], place_ms + 1000)
  keep(KEYS[4], place_ms + 1000)
end
local first = redis.call("ZRANGE", KEYS[1], 0, 0, "WITHSCORES")
local lapses = 0
if first[2] then lapses = math.max(1, tonumber(first[2]) - now_ms) end
return {2, held, lapses, ahead}
