--[[
Slots: at most maxConcurrent calls to an interface in flight across the fleet. One
script takes a slot (with the rate permit) and gives one back, handing it straight to
the first caller queued for it.

This file is not a script on its own: backends/scripts.py composes it after the two
decision scripts wrapped as functions,

    local function rate_bucket(KEYS, ARGV) <bucket.lua> end
    local function rate_limits(KEYS, ARGV) <limits.lua> end
    <this file>

so the rate's semantics stay in bucket.lua and limits.lua alone; this file only decides
who holds a slot and asks the rate with that caller's own keys and arguments.

Slots are leases: KEYS[1] is a sorted set of lease ids scored by the moment (ms on the
server's clock) each expires. A live process renews its leases (slot_renew.lua); a dead
one's expire, and every call here first drops the expired ones. So a crash, a lost
release or a Redis restart never leaves a slot counted for longer than a lease.

Fairness: a caller that finds no slot free takes a ticket (KEYS[4], INCR) and waits in
the queue KEYS[2] (sorted by ticket), leaving what it asks of the rate in KEYS[5]. A
caller may take a slot only when fewer than the free slots are queued ahead of it, so
slots go in ticket order across the fleet. A waiter's place lapses (KEYS[3], by expiry)
unless it asks again before its place time: a dead waiter never holds up the queue for
longer than that.

Hand-over: a release gives the freed slot to the head of the queue at once: it asks
the rate for that waiter (its keys and arguments as it left them, its budget counted
from now), leases the slot to it and publishes on the channel who got it and the rate's
reply, so the waiter only has to be woken, not to ask again. The grant is also kept in
KEYS[6] until the waiter asks or the lease goes, for a waiter that missed the message.
A waiter the rate refuses leaves the queue, is told so, and the next one is tried.

KEYS[1]  leases: lease id -> expiry (ms)
KEYS[2]  queue: lease id -> ticket
KEYS[3]  the queue's lapses: lease id -> when its place lapses (ms)
KEYS[4]  the ticket counter
KEYS[5]  what each queued caller asks of the rate (hash: lease id -> msgpack)
KEYS[6]  grants not yet claimed by asking (hash: lease id -> the rate's reply)
KEYS[7..] the decision script's keys (take only)
ARGV[1]  "take" or "release"
ARGV[2]  maxConcurrent
ARGV[3]  lease in ms
ARGV[4]  this call's lease id (also its place in the queue)
take:    ARGV[5] ms a place in the queue is kept without the waiter asking again (0: no
         place); ARGV[6] "bucket" or "limits"; ARGV[7] which of the decision's
         arguments is its timeout (µs); ARGV[8..] the decision script's arguments
release: ARGV[5] the channel

take returns {state, in flight after this call, ms, ahead, then the decision's reply}:
state 1: taken (the rate permit and the slot; wait what the decision says, then go);
state 0: the rate refused (nothing taken, the place in the queue given up);
state 2: no slot free for this caller: it is queued; ms is when the first lease lapses
         (0: none), a moment worth asking again at if no grant comes before; ahead: the
         callers queued before this one.
release returns {1 if the lease was held else 0, leases held after the hand-over}.
A grant's message: "<lease id>\n<state 1 or 0>\n<in flight>\n<the rate's reply>" (its
48 bytes as they are: the message is split at the first three newlines only).
]]

-- rate_decision's reply: the only lines here that know its format
-- The rate's reply: six packed doubles (bucket.lua), the first two allowed and wait.
local function admitted(reply) return (struct.unpack("<d", reply)) == 1 end
local function wait_us(reply)
  local _, wait = struct.unpack("<dd", reply)
  return wait
end

local RATE = {bucket = rate_bucket, limits = rate_limits}
local HAND_OVER_TRIES = 8  -- waiters the rate may refuse in one release

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local LEASES, QUEUE, LAPSES, COUNTER, ASKS, GRANTS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local op, max, lease_ms, id = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]

-- Keys live as long as what they hold matters (the counter as long as the queue).
local function keep(key, ms)
  if redis.call("PTTL", key) < ms then redis.call("PEXPIRE", key, ms) end
end

-- A reply as text for the channel, binary-safe: "i<n>;" per number, "s<len>:<bytes>"
-- per string (what Redis would have replied: numbers as integers).
local function leave_queue(who)
  redis.call("ZREM", QUEUE, who)
  redis.call("ZREM", LAPSES, who)
  redis.call("HDEL", ASKS, who)
end

-- lease a slot to `who` for `ms` from when its call goes (after the rate's wait);
-- returns the ms from now until it lapses
local function lease(who, reply, ms)
  local lapses_ms = math.ceil(wait_us(reply) / 1000) + ms
  redis.call("ZADD", LEASES, now_ms + lapses_ms, who)
  keep(LEASES, lapses_ms + 1000)
  return lapses_ms
end

-- drop lapsed leases (and their unclaimed grants) and lapsed places
local lapsed = redis.call("ZRANGEBYSCORE", LEASES, "-inf", now_ms)
if #lapsed > 0 then
  redis.call("ZREMRANGEBYSCORE", LEASES, "-inf", now_ms)
  redis.call("HDEL", GRANTS, unpack(lapsed))
end
for _, gone in ipairs(redis.call("ZRANGEBYSCORE", LAPSES, "-inf", now_ms)) do
  leave_queue(gone)
end

if op == "release" then
  local removed = redis.call("ZREM", LEASES, id)
  leave_queue(id)
  redis.call("HDEL", GRANTS, id)
  local held, tries = redis.call("ZCARD", LEASES), 0
  while held < max and tries < HAND_OVER_TRIES do
    local head = redis.call("ZRANGE", QUEUE, 0, 0)[1]
    if not head then break end
    local asked = redis.call("HGET", ASKS, head)
    leave_queue(head)
    if asked then
      tries = tries + 1
      local ask = cmsgpack.unpack(asked)  -- {kind, keys, argv, timeout's index, deadline, lease}
      if ask[1] == "bucket" and ask[4] == 4 then
        -- left by a version before bucket.lua took its row packed (rate, capacity,
        -- permits, budget, now, warm-up as text; the budget 4th): a rolling upgrade
        local a = ask[3]
        local config = struct.pack("<ddd", tonumber(a[1]), tonumber(a[2]), tonumber(a[6] or "0") or 0)
        ask[3], ask[4] = {config, a[3], a[4], a[5]}, 3
      end
      if ask[1] == "bucket" and #ask[2] == 2 then
        -- left by a version before the pair shared the quota's key (the bucket's key
        -- first, the quota's second; the quota's doubles in ARGV[5]): a rolling upgrade
        local a, unpack = ask[3], struct.unpack
        local rate, capacity = unpack("<dd", a[1])
        local share, burst = -1, 0
        if #a[1] == 32 then share = unpack("<d", a[1], 25) end
        local qrate, b0, b1, b2, b3 = unpack("<ddddd", a[5])
        if #a[5] == 48 then burst = unpack("<d", a[5], 41) end
        local config = struct.pack("<ddddddddd", rate, capacity, qrate, b0, b1, b2, b3, burst, share)
        ask[2], ask[3] = {ask[2][2]}, {config, a[2], a[3], a[4]}
      end
      if ask[5] >= 0 then  -- its budget, counted from now (negative: no limit)
        ask[3][ask[4]] = tostring(math.max(0, ask[5] - now_ms) * 1000)
      end
      local reply = RATE[ask[1]](ask[2], ask[3])
      local state = 0
      if admitted(reply) then
        state, held = 1, held + 1
        local lapses_ms = lease(head, reply, ask[6])
        redis.call("HSET", GRANTS, head, reply)
        keep(GRANTS, lapses_ms + 1000)
      end
      redis.call("PUBLISH", ARGV[5], head .. "\n" .. state .. "\n" .. held .. "\n" .. reply)
    end
  end
  return {removed, held}
end

local held = redis.call("ZCARD", LEASES)
if redis.call("ZSCORE", LEASES, id) then  -- a release handed this caller a slot
  local granted = redis.call("HGET", GRANTS, id)
  if granted then
    redis.call("HDEL", GRANTS, id)
    return {1, held, 0, 0, granted}
  end
end

local place_ms = tonumber(ARGV[5])
local ahead = redis.call("ZRANK", QUEUE, id)
if not ahead then ahead = redis.call("ZCARD", QUEUE) end

local keys, argv = {}, {}
for i = 7, #KEYS do keys[#keys + 1] = KEYS[i] end
for i = 8, #ARGV do argv[#argv + 1] = ARGV[i] end

if held + ahead < max then
  local reply = RATE[ARGV[6]](keys, argv)
  leave_queue(id)
  if admitted(reply) then
    lease(id, reply, lease_ms)
    return {1, held + 1, 0, 0, reply}
  end
  return {0, held, 0, 0, reply}
end

if place_ms > 0 then  -- 0: the caller will not wait, so it takes no place
  if not redis.call("ZSCORE", QUEUE, id) then
    redis.call("ZADD", QUEUE, redis.call("INCR", COUNTER), id)
  end
  redis.call("ZADD", LAPSES, now_ms + place_ms, id)
  local timeout_at = tonumber(ARGV[7])
  local budget_us = tonumber(argv[timeout_at])
  local deadline = -1
  if budget_us >= 0 then deadline = now_ms + math.floor(budget_us / 1000) end
  redis.call("HSET", ASKS, id, cmsgpack.pack({ARGV[6], keys, argv, timeout_at, deadline, lease_ms}))
  for _, key in ipairs({QUEUE, LAPSES, COUNTER, ASKS}) do keep(key, place_ms + 1000) end
end
local first = redis.call("ZRANGE", LEASES, 0, 0, "WITHSCORES")
local lapses = 0
if first[2] then lapses = math.max(1, tonumber(first[2]) - now_ms) end
return {2, held, lapses, ahead}
