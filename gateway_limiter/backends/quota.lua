--[[
Calendar quotas' counters raised to what is known to be spent, and read: what the
supplier reports (limiter.observe) and what a checkpoint saved (a Redis that came back
without the counter). raise_counter() in gateway_limiter/model/quota_floor.py is the same
model in Python; in short, for each counter i:

  1. the period it speaks of, w: the one given (a checkpoint's), or, given as 0, the
     period the server's clock is in among the boundaries b0..b3 (the supplier's report,
     which speaks of now);
  2. nothing is written unless u > 0, w is the period the clock is in or a later one
     (a checkpoint of a period already over means nothing now), and w's period ends no
     later than `until` (a supplier's count that renews before ours says nothing of
     what is left of ours);
  3. then the counter follows: a counter of an earlier period (or none, or a key that
     holds something else) becomes (w, u); a counter of w keeps the larger of its count
     and u; a counter of a later period is left alone. A count is never lowered: a
     report or a checkpoint only ever lowers what is left.

A counter's key is limits.lua's (two packed doubles: the start of its period, epoch us,
and the permits reserved in it; a paced quota's two more, its pacing bucket, kept as
they are when the count of the same period is raised; after them, a bucket's state and
its pushback's where bucket.lua decides the quota beside a bucket, kept as they are) and expires as limits.lua has it
expire: a second after its period ends (from b3 on, whose end is a guess, twice the length
of [b2, b3) past its start). With a member given, each counter's lock (KEYS[n + i]) is taken for
that member, or renewed where it holds it already: the one process that checkpoints the
counter to the database (core/quotas.py).

KEYS[1..n]    the counters (every key of one call shares a hash tag on a cluster)
KEYS[n+1..2n] with a member: their locks
ARGV[1]       now in microseconds, or "" for the server's TIME (tests drive the clock)
ARGV[2]       the member taking the locks, or "" (no locks: KEYS are the counters alone)
ARGV[3]       the locks' time to live, ms
ARGV[4]       the struct format of ARGV[5]: "<" and 7n "d"
ARGV[5]       seven doubles per counter: b0, b1, b2, b3 (epoch us; the periods
              [b0, b1), [b1, b2), [b2, b3) as limits.lua is told them), w (0: the
              period of now), u (the count it holds at least), until (epoch us; inf:
              no bound)

Returns one string of little-endian doubles: now, then per counter the start of its
period and its count after this call (0, 0: none), and 1 where this member holds its
lock (else 0).
]]

local pack, unpack, spread = struct.pack, struct.unpack, unpack  -- spread: a table's values
local call, pcall_ = redis.call, redis.pcall
local max, ceil = math.max, math.ceil

local now = ARGV[1]
if now == "" then
  local t = call("TIME")
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(now)
end
local member = ARGV[2]
local n = #KEYS
if member ~= "" then n = n / 2 end
local ttl = tonumber(ARGV[3])
local f = {unpack(ARGV[4], ARGV[5])}

local out = {now}
for i = 1, n do
  local o = 7 * (i - 1)
  local b0, b1, b2, b3, w, u, upto = f[o + 1], f[o + 2], f[o + 3], f[o + 4], f[o + 5], f[o + 6], f[o + 7]
  local start = b0  -- the period the clock is in
  if now >= b3 then start = b3 elseif now >= b2 then start = b2 elseif now >= b1 then start = b1 end
  if w == 0 then w = start end
  local ends  -- the end of w's period
  if w < b1 then ends = b1 elseif w < b2 then ends = b2 elseif w < b3 then ends = b3 else ends = w + (b3 - b2) end
  local window, used, stored, balance = 0, 0, -1, 0
  local saved = pcall_("GET", KEYS[i])
  local rest = ""  -- a bucket (and its pushback) after the count: kept (bucket.lua)
  if type(saved) == "string" then
    local n = #saved
    if n == 16 or n == 56 or n == 88 then
      window, used = unpack("<dd", saved)
      rest = string.sub(saved, 17)
    elseif n == 32 or n == 72 or n == 104 then  -- a paced quota's
      window, used, stored, balance = unpack("<dddd", saved)
      rest = string.sub(saved, 33)
    end
  end
  if u > 0 and w >= start and ends <= upto and window <= w and (window < w or used < u) then
    local state
    if window == w and stored >= 0 then  -- the pacing bucket stays as it was
      state = pack("<dddd", w, u, stored, balance)
    else  -- a period of its own: no pacing bucket kept (it starts full)
      state = pack("<dd", w, u)
    end
    window, used = w, u
    -- from b3 on the period's end is a guess: keep the count twice its length, as the
    -- decision scripts do (calendar.lua), so a longer period does not lose it
    local expires = ends
    if w >= b3 then expires = w + 2 * (b3 - b2) end
    local px = max(1000, ceil((expires - now) / 1000) + 1000)
    if rest ~= "" then px = max(px, call("PTTL", KEYS[i])) end  -- as long as the bucket needs
    call("SET", KEYS[i], state .. rest, "PX", px)
  end
  local held = 0
  if member ~= "" then
    local lock = KEYS[n + i]
    local holder = pcall_("GET", lock)
    if holder == member or not holder then
      call("SET", lock, member, "PX", ttl)
      held = 1
    end
  end
  out[#out + 1] = window
  out[#out + 1] = used
  out[#out + 1] = held
end
return pack("<" .. string.rep("d", #out), spread(out))
