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
ARGV[2]  timeout in microseconds; negative = wait as long as it takes (sent as "0" and
         "-1" for the usual two, recognised without parsing)
ARGV[3]  now in microseconds, or "" for the server's TIME (tests drive the clock)
ARGV[4]  the struct format of ARGV[5]: "<" and 1 + 6n + m "d" (m paced quotas)
ARGV[5]  the limits, as little-endian doubles (backends/scripts.py packs them once per
         row): first how many limits are the interface's own (the rest, last, are its
         channel's: a channel cap, shared with other interfaces, which the interface's
         pushback neither scales nor delays, though the call still goes no sooner than
         its moment); then six per limit i: its kind, rate and size, and three zeros
         that this script fills with what it reads of the limit's state:
         kind 1, a token bucket: permits per second, capacity
         kind 2, a sliding window: permits per window, window length in microseconds
         kind 3, a fixed window: permits per window, period P in microseconds
         kind 4, a calendar quota: permits per period (model/limits.py, CalendarLimit),
                 then in place of the size and the zeros four boundaries b0..b3 (epoch
                 microseconds) of the periods [b0, b1), [b1, b2), [b2, b3) around the
                 deciding process's clock; the script picks the period by its own
                 clock. Its key holds two packed doubles: the start of the period that
                 holds reservations, and the permits reserved in it
         kind 5, a paced calendar quota: as kind 4, and its burst is the next of the m
                 doubles after the 6n (one per paced quota, in order). Besides the
                 count it keeps a bucket of at most the burst, refilled at the pace its
                 last decision set (the permits left over the time left of the
                 period): no call goes before the bucket has its permits. Its key holds
                 four doubles: the two of kind 4, the bucket's permits and when they
                 were counted. A key of two (the quota was not paced) has a full bucket;
                 kind 4 reads the first two of four. Kinds 4 and 5 are decided by
                 calendar.lua's two sections, which backends/scripts.py takes in
                 here and into bucket.lua (a bucket and a quota in one call)
         Packed, the limits are one unpack into one table sized for all of them, rather
         than a tonumber per field (each as dear as a line of arithmetic ten times over).
         Priority classes (model/priority.py): a call of a class below critical on
         limits with a reserve has one more double per limit after them (and after the
         paced quotas' bursts), its share.
         The call then goes now, leaving every limit its share (a bucket that many
         stored, a window that many uncounted), or is refused with the wait until it
         could, recording nothing (allowed -1: "reserved", the limits alone would have
         admitted it in time). Calendar quotas keep no reserve.

Returns one string of six little-endian doubles, like bucket.lua: allowed (1/0), wait in
microseconds, the least permits any limit has left (a bucket its stored permits, a window
its count less the admissions in the window of T, or of now when refused), next free, the
pushback factor, held (microseconds from now until a pushback's retry_after ends; 0:
none). Next free: microseconds from now before which no call can go, the latest of each
limit's earliest time for one permit after this decision (only time passing brings it
closer). A window that can never hold the permits wanted refuses with an infinite wait
(and next free 0: not every limit was read). So does a calendar quota asked for more
than its permits per period, or a paced one for more than its burst (its bucket never
holds more), after every limit is read as for any refusal. A call that would go past
the periods a calendar quota knows (a T later than its b3, unless T is now: the length
of the period from b3 is a guess) is refused whatever its timeout, told the wait to
the latest of the limits' times with that quota's at most b3 (calendar.lua). With a calendar quota among
the limits, three more doubles follow: the permits left in the period the server's
clock is in, of the quota with the fewest left (on a tie, the one whose period ends
later; the one that can never give the permits, when one cannot), and when that period
ends (epoch microseconds), and that quota's permits per period.

Like bucket.lua, it runs as few Lua steps as it can (server time caps one Redis core):
no closures, no number parsed from text but the budget (and the clock), one flat table
for every limit's fields and state, built by one unpack, each limit's state read once
(a sliding window's next free comes from what step 1 read and step 3 wrote; only a
full window reads its oldest admission again), and a sliding window's list trimmed only
when a call fills it past the rate.
]]


local max, floor, ceil = math.max, math.floor, math.ceil
local pack, unpack = struct.pack, struct.unpack
local call, pcall_ = redis.call, redis.pcall

local permits = ARGV[1]
if permits == "1" then permits = 1 else permits = tonumber(permits) end  -- most calls: no parse
local timeout = ARGV[2]  -- "0" and "-1", the usual two, without parsing (bucket.lua)
if timeout == "0" then timeout = 0 elseif timeout == "-1" then timeout = -1 else timeout = tonumber(timeout) end
local now = ARGV[3]
if now == "" then
  local t = call("TIME")
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(now)
end

-- Every limit's fields, six per limit from lim[2] (see ARGV[5]): kind, rate, size, then
-- what step 1 reads of its state for step 3 and next free: a bucket's stored permits
-- and balance, a fixed window's k and permits used, a sliding window's length, last
-- admission time and 1 if its key held something else.
local lim = {unpack(ARGV[4], ARGV[5])}
local nlimits = #KEYS - 1
local own = lim[1]

-- Pushback, as in bucket.lua: the last key; its factor is void under another rate than
-- the first limit's (the row changed). A key holding anything else than its kind's
-- state (another type, another length) is lost state, as in bucket.lua: read with
-- pcall (a wrong type answers a table, whose length is 0), start afresh, replace it on
-- a write.
local qleft, qreset, qlimit  -- calendar quotas (kinds 4 and 5): only where there is one
-- what step 1 read of each quota, five per limit from 5 i - 4: the counter's period and
-- count, a paced one's bucket (permits, when) and burst (read from the tail); one table
local qs
local never  -- the first quota that can never give the permits (model: calendar_most)
-- a quota would let the call go only past the periods it knows (calendar.lua), and the
-- earliest end of them (b3) of every quota: no T later than that but now is booked
local beyond, horizon
local tail = 2 + 6 * nlimits
local factor, pushed_until, held = 1, 0, 0
local pushed = pcall_("GET", KEYS[nlimits + 1])
if pushed and #pushed == 32 then
  local RECOVERY_PER_US = 0.05 / 1000000
  local f, since, pushed_rate
  pushed_until, f, since, pushed_rate = unpack("<dddd", pushed)
  if pushed_rate == lim[3] then
    factor = f + max(0, now - since) * RECOVERY_PER_US
    if factor > 1 then factor = 1 end
  end
  if pushed_until > now then held = pushed_until - now end  -- how long the hold lasts
end

-- 1. each limit's earliest time; T (at) is the latest of them.
local at = now
if pushed_until > now then at = pushed_until end
for i = 1, nlimits do
  local b = 6 * i - 4
  local factor, pushed_until = factor, pushed_until  -- capacity shares: a channel's limit
  if i > own then factor, pushed_until = 1, 0 end    -- is not this interface's to push
  local kind, rate, size = lim[b], lim[b + 1], lim[b + 2]
  -- Pushback slows every limit: a bucket's rate and capacity, a window's count (cap),
  -- in whole permits and at least this call's (else it could never go). next_free and
  -- the trim keep the window's own rate: the factor only recovers.
  local cap = rate
  if factor ~= 1 then
    if kind == 1 then
      rate, size = rate * factor, size * factor
      lim[b + 1], lim[b + 2] = rate, size
    else
      cap = max(permits, floor(rate * factor))
    end
  end
  local earliest
  if kind == 1 then
    local stable = 1000000 / rate
    local saved = pcall_("GET", KEYS[i])
    local stored, balance, old_rate, old_capacity, old_refill
    if saved and #saved == 40 then
      stored, balance, old_rate, old_capacity, old_refill = unpack("<ddddd", saved)
    else  -- no state: full and in balance
      stored, balance, old_rate, old_capacity, old_refill = size, now, rate, size, stable
      saved = nil
    end
    if pushed_until > 0 and (saved == nil or balance < pushed_until) then
      stored, balance = 0, pushed_until  -- a hold drains the bucket (bucket.lua)
    end
    if now > balance then  -- resync at the refill rate the state was built with
      stored = stored + (now - balance) / old_refill
      if not (stored < old_capacity) then stored = old_capacity end
      balance = now
    end
    if old_rate ~= rate or old_capacity ~= size or old_refill ~= stable then
      if old_capacity > 0 then  -- a config change rescales stored permits, keeps debt
        stored = stored * size / old_capacity
      else
        stored = size
      end
    end
    local spend = permits
    if stored < permits then spend = stored end
    earliest = balance + (permits - spend) * stable  -- balance >= now after the resync
    lim[b + 3], lim[b + 4] = stored, balance
  elseif permits > rate and kind < 4 then  -- a window: more than it ever holds
    return pack("<dddddd", 0, math.huge, 0, 0, factor, held)
  elseif kind == 2 then
    earliest = now
    local count = pcall_("LLEN", KEYS[i])
    if type(count) ~= "number" then  -- not a list: an empty window, the key replaced
      count, lim[b + 5] = 0, 1
    end
    local last = 0
    if count > 0 then
      last = tonumber(call("LINDEX", KEYS[i], -1))
      if last > earliest then earliest = last end
    end
    local need = count + permits - cap  -- admissions that must have left the window
    if need > 0 then
      earliest = max(earliest, tonumber(call("LINDEX", KEYS[i], need - 1)) + size)
    end
    lim[b + 3], lim[b + 4] = count, last
  elseif kind >= 4 then  -- a calendar quota: the period holding now among b0..b3
    local qrate, b0, b1, b2, b3, burst = rate, size, lim[b + 3], lim[b + 4], lim[b + 5]
    if kind == 5 then  -- paced: its burst, the next after the limits
      burst = lim[tail]
      tail = tail + 1
    end
    -- more than its period holds, or than a paced one's bucket ever holds: refused
    -- whatever the wait, and this quota's figures told (step 3); every limit still read
    if never == nil and (permits > qrate or (burst and permits > burst)) then never = i end
    local saved, window, used, qstored, qbalance, kept, ends = pcall_("GET", KEYS[i])
-- include: calendar.lua, step 1
    if horizon == nil or b3 < horizon then horizon = b3 end
    if qs == nil then qs = {} end
    local q = 5 * i  -- the boundaries stay in lim for step 3
    qs[q - 4], qs[q - 3] = window, used
    if kind == 5 then qs[q - 2], qs[q - 1], qs[q] = qstored, qbalance, burst end
  else  -- 3: a fixed window
    local window, used = floor(now / size), 0
    local saved = pcall_("GET", KEYS[i])
    if saved and #saved == 16 then
      local w, u = unpack("<dd", saved)
      if w >= window then window, used = w, u end
    end
    if used + permits > cap then
      earliest = (window + 1) * size
    else
      earliest = window * size
    end
    if now > earliest then earliest = now end
    lim[b + 3], lim[b + 4] = window, used  -- not moved on: step 3 does that, and a refusal keeps it
  end
  if earliest > at then at = earliest end
end

-- 2. refuse without writing anything, or record the call at T in every limit (3); and
-- the earliest moment (from now) any call could go after the decision: every limit's
-- earliest time for one permit (a sliding window's oldest admission still counted is
-- read here: the only read a decision makes twice of a key). One loop does both.
local wait = at - now
local allowed = 1
if timeout >= 0 and wait > timeout then allowed = 0 end
if beyond or (horizon and at > horizon and at > now) then allowed = 0 end  -- whatever the budget
if never then allowed, wait = 0, math.huge end  -- no wait would ever do
-- Priority classes (the shares after the limits): when every limit could leave its
-- share, now.
local code = nil
local shares = tail - 1  -- after the limits and the paced quotas' bursts (step 1 read
if #lim > tail and not never then  -- them); unpack ends lim with the position after the last
  local ready = at
  for i = 1, nlimits do
    local s = lim[shares + i]
    local b = 6 * i - 4
    if s > 0 then
      local t = now
      local kind, rate, size = lim[b], lim[b + 1], lim[b + 2]
      if kind == 1 then
        local need = permits + s * size
        t = math.huge
        if need <= size then t = lim[b + 4] + max(0, need - lim[b + 3]) * (1000000 / rate) end
      elseif kind == 2 or kind == 3 then
        local cap = rate
        if factor ~= 1 and i <= own then cap = max(permits, floor(rate * factor)) end
        local k = floor(cap - s * cap)
        if permits > k then
          t = math.huge
        elseif kind == 2 then
          local need = lim[b + 3] + permits - k
          if need > 0 then t = tonumber(call("LINDEX", KEYS[i], need - 1)) + size end
        elseif lim[b + 4] + permits > k then
          t = (lim[b + 3] + 1) * size
        end
      end
      if t > ready then ready = t end
    elseif lim[b] == 1 and permits > lim[b + 2] then  -- no share, yet more than it holds:
      ready = math.huge                               -- never at once, and no debt taken
    end
  end
  if ready > now then
    code = 0  -- reserved when the limits alone admit it, or the class never gets it
    if allowed == 1 or ready == math.huge then code = -1 end
    allowed, wait = 0, ready - now
  end
end
local least = nil
local free = now
if pushed_until > now then free = pushed_until end
for i = 1, nlimits do
  local b = 6 * i - 4
  local kind, rate, size, earliest = lim[b], lim[b + 1], lim[b + 2], now
  if kind == 1 then
    local stable = 1000000 / rate
    local stored, balance = lim[b + 3], lim[b + 4]  -- balance >= now (step 1)
    if allowed == 1 then
      if at > balance then
        stored = stored + (at - balance) / stable
        if not (stored < size) then stored = size end
      end
      stored = stored - permits
      if not (stored > 0) then stored = 0 end
      balance = at
      local full_at = at + (size - stored) * stable  -- at >= now
      call("SET", KEYS[i], pack("<ddddd", stored, at, rate, size, stable),
        "PX", ceil((full_at - now) / 1000) + 1000)
    end
    if least == nil or stored < least then least = stored end
    earliest = balance
    if stored < 1 then earliest = balance + (1 - stored) * stable end
  elseif kind == 2 then
    local count, last = lim[b + 3], lim[b + 4]
    if allowed == 1 then
      if lim[b + 5] == 1 then call("DEL", KEYS[i]) end
      for _ = 1, permits do  -- a number: Redis writes it with 17 significant digits
        call("RPUSH", KEYS[i], at)
      end
      count, last = count + permits, at
      if count > rate then  -- only a full window has admissions to drop
        call("LTRIM", KEYS[i], -rate, -1)
        count = rate
      end
      call("PEXPIRE", KEYS[i], ceil((at + size - now) / 1000) + 1000)
    end
    if count > 0 and last > earliest then earliest = last end
    local live = count  -- admissions still in the window at T (now when refused)
    if count > 0 then
      local ref = now
      if allowed == 1 then ref = at end
      if tonumber(call("LINDEX", KEYS[i], 0)) + size <= ref then  -- stale ones first:
        local lo, hi = 0, count                                   -- find the first live
        while hi - lo > 1 do
          local mid = floor((lo + hi) / 2)
          if tonumber(call("LINDEX", KEYS[i], mid)) + size <= ref then lo = mid else hi = mid end
        end
        live = count - hi
      end
    end
    local cap = rate
    if factor ~= 1 and i <= own then cap = max(1, floor(rate * factor)) end
    if least == nil or cap - live < least then least = max(0, cap - live) end
    if count + 1 > rate then
      earliest = max(earliest, tonumber(call("LINDEX", KEYS[i], count - rate)) + size)
    end
  elseif kind >= 4 then
    local q = 5 * i
    local qrate, b0, b1, b2, b3, burst = rate, size, lim[b + 3], lim[b + 4], lim[b + 5], qs[q]
    local window, used, qstored, qbalance = qs[q - 4], qs[q - 3], qs[q - 2], qs[q - 1]
    local at, ends, left, reset, expires = allowed == 1 and at
-- include: calendar.lua, step 3
    if allowed == 1 then  -- (a period already over: a process clock periods behind)
      local state
      if kind == 5 then state = pack("<dddd", window, used, qstored, qbalance) else state = pack("<dd", window, used) end
      call("SET", KEYS[i], state, "PX", max(1000, ceil((expires - now) / 1000) + 1000))
    end
    if never == i or (never == nil and (qleft == nil or left < qleft
        or (left == qleft and reset > qreset))) then  -- the one that binds
      qleft, qreset, qlimit = left, reset, rate
    end
  else
    local window, used = lim[b + 3], lim[b + 4]
    if allowed == 1 then
      local w = floor(at / size)
      if w > window then window, used = w, 0 end
      used = used + permits
      call("SET", KEYS[i], pack("<dd", window, used),
        "PX", ceil(((window + 1) * size - now) / 1000) + 1000)
    end
    local cap = rate
    if factor ~= 1 and i <= own then cap = max(1, floor(rate * factor)) end
    if least == nil or cap - used < least then least = max(0, cap - used) end
    if used + 1 > rate then
      earliest = (window + 1) * size
    else
      earliest = window * size
      if now > earliest then earliest = now end
    end
  end
  if earliest > free then free = earliest end
end
if code ~= nil then allowed = code end
if qleft ~= nil then
  return pack("<ddddddddd", allowed, wait, least or 0, free - now, factor, held, qleft, qreset, qlimit)
end
return pack("<dddddd", allowed, wait, least or 0, free - now, factor, held)
