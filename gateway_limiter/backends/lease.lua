--[[
A lease: permits of one token bucket taken ahead in one round trip, spent by one process
in-process (docs/algorithms.md, "Leases"; core/leases.py is the process's side). It is
composed after bucket.lua, wrapped as the function bucket_decision (scripts.py,
with_lease), so the bucket's semantics stay in bucket.lua and its state format
(five doubles, plus four of pushback) is read and written as bucket.lua does.

  1. hand back: what the previous lease left unused returns to the stored ones, less
     what the bucket can have refilled since that lease was taken (its age on this
     server's clock, at the faster of the rate the state holds and the caller's): a
     lease of u unused permits taken a µs ago returns max(0, u - a x rate), so one
     older than leaseMs returns nothing, and a hand-back never leaves the bucket
     holding more than it would had those permits never been taken (docs/algorithms.md,
     "Leases": the bound this keeps for any traffic). Never beyond the capacity the
     state was built with, after the refill due. Nothing returns into a bucket that
     has no state (a full one), nor while a pushback's hold is unabsorbed (the hold
     empties the bucket anyway), nor without the take's moment: what cannot return is
     dropped, which only under-admits.
  2. the caller's own permits, decided by bucket.lua as a plain call would be (its
     wait budget, debt, pushback), so a lease row never refuses what a plain row would
     admit in the same state;
  3. only if that took stored permits with no wait: up to lease - permits more stored
     permits (whole ones, without debt and without waiting), in one more decision at
     the same moment; on a row with a reserve (priority classes), only from the part
     above every class's reserve: they leave ARGV[9] of the capacity stored, so any
     class may spend them and none of them is a reserve held in one process;
  4. if that left the lease short (the bucket ran dry), the caller may wait (a budget
     B > 0, or none) and the row is not held by a pushback: the rest of the lease as
     debt, in one more decision at the same moment, each permit scheduled as bucket.lua
     schedules one-permit calls made one after another (one effective stable interval
     apart, the factor included), the last no later than B from now and no more than
     leaseMs (ARGV[8]) after the first: what the caller's followers can wait for.
     The process hands them to its next waiting callers, each sleeping until its
     permit's moment; debt is never handed back.

KEYS[1]  the bucket's state (bucket.lua's key)
ARGV[1]  the row's bucket: bucket.lua's ARGV[1] (rate, capacity, warm-up as packed doubles)
ARGV[2]  permits the caller wants now (>= 1; 0: hand back only)
ARGV[3]  the caller's timeout in microseconds; negative = wait as long as it takes
ARGV[4]  now in microseconds; "" = the server's TIME (tests drive the clock)
ARGV[5]  lease: the most permits to take in all, the caller's included (>= ARGV[2])
ARGV[6]  unused permits of the previous lease to hand back (>= 0)
ARGV[7]  when that lease was taken: the eighth double of its reply (µs on this clock)
ARGV[8]  leaseMs in microseconds: the longest a debt lease spans (absent or 0: no debt)
ARGV[9]  a row with a reserve: the largest share of the capacity a class must leave (the
         lowest class's), which the lease's permits beyond the caller's leave stored;
         absent or 0: none. Such a row sends ARGV[8] 0: a debt lease would reserve
         future permits for whichever class comes next, and only critical may.

Returns eleven packed doubles (one bulk string, as bucket.lua's six): bucket.lua's six
for the caller's decision (the stored and next free ones as left after the lease), a
seventh: the permits granted from stored ones in all (0 when the caller was refused;
the caller's included), an eighth: now (µs), the moment of this lease, which its
hand-back sends back as ARGV[7]; then the debt lease (step 4): the permits scheduled
(0: none), the first one's moment (µs from now) and the interval between them (µs).
]]

local now  -- one moment for the hand back and every decision (passed as a number)
if ARGV[4] == nil or ARGV[4] == "" then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[4])
end
local rate = struct.unpack("<d", ARGV[1])

-- 1. hand back
local unused = tonumber(ARGV[6])
local taken_at = tonumber(ARGV[7] or "")
if unused > 0 and taken_at ~= nil and taken_at <= now then
  local saved = redis.pcall("GET", KEYS[1])
  if type(saved) == "string" and (#saved == 40 or #saved == 72) then
    local stored, balance, r, c, k = struct.unpack("<ddddd", saved)
    local tail, unabsorbed = "", false
    if #saved == 72 then
      tail = string.sub(saved, 41)
      local pushed_until = struct.unpack("<d", tail)
      unabsorbed = pushed_until > 0 and balance < pushed_until
    end
    -- less what can have refilled since the take: never more than had it not been taken
    local back = unused - (now - taken_at) / math.min(k, 1000000 / rate)
    if stored >= 0 and not unabsorbed and back > 0 then
      if now > balance then
        stored = math.min(c, stored + (now - balance) / k)
        balance = now
      end
      stored = math.min(c, stored + back)
      local px = math.ceil((math.max(balance, now) + (c - stored) * k - now) / 1000) + 1000
      px = math.max(px, redis.call("PTTL", KEYS[1]))  -- a pushback's part may need longer
      redis.call("SET", KEYS[1], struct.pack("<ddddd", stored, balance, r, c, k) .. tail, "PX", px)
    end
  end
end

local permits = tonumber(ARGV[2])
if permits <= 0 then
  return struct.pack("<ddddddddddd", 1, 0, 0, 0, 1, 0, 0, now, 0, 0, 0)
end

-- 2. the caller's permits, as a plain call (bucket.lua's reply: six packed doubles)
local reply = bucket_decision({KEYS[1]}, {ARGV[1], permits, ARGV[3], now})
local allowed, wait, stored, next_free, factor, held = struct.unpack("<dddddd", reply)
local granted, owed, first, interval = 0, 0, 0, 0
if allowed == 1 then
  granted = permits
  -- 3. the rest of the lease, from stored permits only
  local more = math.min(tonumber(ARGV[5]) - permits, math.floor(stored))
  local floor = tonumber(ARGV[9] or "") or 0
  if floor > 0 then  -- above every class's reserve (the capacity as the factor leaves it)
    local _, capacity = struct.unpack("<dd", ARGV[1])
    more = math.min(more, math.floor(stored - floor * capacity * factor))
  end
  if wait == 0 and more >= 1 then
    local taken = bucket_decision({KEYS[1]}, {ARGV[1], more, 0, now})
    local took, _, left, free = struct.unpack("<dddd", taken)
    if took == 1 then
      granted = granted + more
      stored, next_free = left, free
    end
  end
  -- 4. the rest, the bucket dry, as debt for callers who wait: the k-th (k >= 1) is
  -- due at next_free + (k - 1) x interval from now, as k one-permit calls would be
  local span = tonumber(ARGV[8] or "") or 0
  local timeout = tonumber(ARGV[3])
  if held == 0 and span > 0 and timeout ~= 0 and stored < 1 then
    local stable = 1000000 / (rate * factor)  -- bucket.lua's effective one
    more = math.min(tonumber(ARGV[5]) - granted, math.floor(span / stable) + 1)
    local limit = -1
    if timeout > 0 then  -- the last within the caller's budget
      more = math.min(more, math.floor((timeout - next_free) / stable) + 1)
      limit = timeout + 1
    end
    if more >= 1 then
      local taken = bucket_decision({KEYS[1]}, {ARGV[1], more, limit, now})
      local took, last, left, free = struct.unpack("<dddd", taken)
      if took == 1 then
        owed, first, interval = more, last - (more - 1) * stable, stable
        stored, next_free = left, free
      end
    end
  end
end
return struct.pack("<ddddddddddd", allowed, wait, stored, next_free, factor, held, granted, now, owed, first, interval)
