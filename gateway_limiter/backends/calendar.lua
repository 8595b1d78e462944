--[[
A calendar quota's arithmetic, written once: backends/scripts.py composes its two sections
into limits.lua (kinds 4 and 5) and into bucket.lua (a token bucket and one calendar quota),
each in place of the line that names it ("-- include: calendar.lua, <section>").
CalendarLimit in gateway_limiter/model/limits.py is the same model in Python; the property
tests on real Redis pin both scripts to it bit for bit.

The periods: [b0, b1), [b1, b2), [b2, b3) and [b3, b3 + (b3 - b2)), epoch microseconds,
computed by the deciding process around its own clock; the period is picked here by the
script's clock. A counter: window (the start of the period holding reservations), used
(the permits reserved in it) and, when paced (burst a number; nil: not paced), its bucket:
qstored permits, counted at qbalance. A new period's bucket is full.

Taken in as text, not called: a function is a closure made on every call of the script
(two of them cost the pair 4,000 instructions of its 77,000 under callgrind). So the
script that takes a section in has these locals in scope:
  given:    unpack (struct.unpack), now, permits, qrate (permits per period), b0, b1,
            b2, b3, burst, and for step 1 saved (the counter's key's value, as GET
            answered it under pcall), for step 3 at (T; false when refused: nothing
            is recorded);
  declared: window, used, qstored, qbalance, kept, ends (the end of the counter's
            period: step 3 takes step 1's where it is in scope, else works it out),
            earliest, for step 1 beyond (set to true, never to false: the script
            starts it nil), and for step 3 left, reset and expires (when the counter's
            key may go); the sections set them, step 3 from the counter step 1 left,
            and the script writes the counter.

The horizon: the process knows the periods up to b3 exactly, and only the start of the
one after. A permit is booked at T no later than b3 (T in a period it knows, or at the
start of the one after), or at now; never at a later T, whose period it would guess
(its end taken as b3 plus the length of [b2, b3)): such a call is refused, whatever its
budget, and told a wait to b3. A counter in the period from b3 keeps its key twice the
length of [b2, b3) past its start: a longer period than the guess (28 days then 31)
must not lose its count.
]]

-- section: step 1
-- The counter as of now (two packed doubles, four with a pacing bucket, either maybe
-- followed by the state of the bucket beside it, bucket.lua; anything else, or
-- nothing, is no counter), and the earliest time it lets the permits go: now if its
-- period has room and has begun, else the start of the next period; paced, also once
-- its bucket, refilled up to now, has them (at the latest the end of the period). kept:
-- the period of the value as it is kept in this quota's form (-1: not kept so).
window, used, qstored, qbalance, kept = b0, 0, -1, 0, -1
if now >= b3 then window = b3 elseif now >= b2 then window = b2 elseif now >= b1 then window = b1 end
if type(saved) == "string" then  -- a wrong type answers pcall with a table
  local n = #saved  -- longer: a bucket (and its pushback) after the count (bucket.lua)
  if n == 16 or n == 56 or n == 88 then
    local w, u = unpack("<dd", saved)
    if w >= window then window, used = w, u end
    if not burst then kept = w end
  elseif n == 32 or n == 72 or n == 104 then
    local w, u, s, t = unpack("<dddd", saved)
    if w >= window then window, used, qstored, qbalance = w, u, s, t end
    if burst then kept = w end
  end
end
ends = b1  -- the end of the counter's period
if window >= b3 then ends = window + (b3 - b2) elseif window >= b2 then ends = b3
elseif window >= b1 then ends = b2 end
if burst and qstored < 0 then qstored, qbalance = burst, now end  -- none kept: full
earliest = window
if used + permits > qrate then  -- full: the start of the period after the counter's
  earliest = ends
elseif burst then  -- paced: once the bucket, refilled up to now, has the permits
  if now > qbalance then
    local span = ends - qbalance
    if span > 0 then qstored = qstored + (now - qbalance) * (qrate - used) / span else qstored = burst end
    if not (qstored < burst) then qstored = burst end
    qbalance = now
  end
  local take = permits
  if qstored < permits then take = qstored end
  local paced = qbalance + (permits - take) * (ends - qbalance) / (qrate - used)
  if paced > ends then paced = ends end
  if paced > earliest then earliest = paced end
end
if now > earliest then earliest = now end
-- Beyond the periods it knows: the period that starts at b3 (the end of the next one)
-- has a guessed end, so no permit is booked later than b3, but now (the clock's own
-- period is picked as ever). A call this quota would let go only later is refused
-- (beyond; the script also refuses a T later than b3 that another limit set), told
-- b3, before which it surely cannot go (the guess, while the clock is past b3).
if earliest > b3 and earliest > now then
  beyond = true
  if b3 > now then earliest = b3 end
end

-- section: step 3
-- The call recorded at T in the period holding T (paced: and taken from the bucket,
-- refilled up to T), then the end of the counter's period, the earliest time it lets
-- one more permit go, the permits left in the period the clock is in (none while
-- reservations already fill it into the next one) and when that period ends (reset).
if ends == nil then  -- the end of the counter's period, unless step 1's is in scope
  ends = b1
  if window >= b3 then ends = window + (b3 - b2) elseif window >= b2 then ends = b3
  elseif window >= b1 then ends = b2 end
end
if at then
  local w = b0  -- the period holding T
  if at >= b3 then w = b3 elseif at >= b2 then w = b2 elseif at >= b1 then w = b1 end
  if w > window then  -- a new period: a new count (and a full bucket)
    window, used, qstored, qbalance = w, 0, burst, at
    if w >= b3 then ends = w + (b3 - b2) elseif w >= b2 then ends = b3 else ends = b2 end
  elseif burst and at > qbalance then
    local span = ends - qbalance
    if span > 0 then qstored = qstored + (at - qbalance) * (qrate - used) / span else qstored = burst end
    if not (qstored < burst) then qstored = burst end
    qbalance = at
  end
  if burst then
    qstored = qstored - permits
    if not (qstored > 0) then qstored = 0 end
  end
  used = used + permits
end
earliest = ends
if used + 1 <= qrate then
  earliest = window
  if now > earliest then earliest = now end
  if burst then  -- paced: once the bucket has a permit
    local take = 1
    if qstored < 1 then take = qstored end
    local paced = qbalance + (1 - take) * (ends - qbalance) / (qrate - used)
    if paced > ends then paced = ends end
    if paced > earliest then earliest = paced end
  end
end
-- next free is a moment before which no call goes: past b3 only a guess, so b3
if earliest > b3 and b3 > now then earliest = b3 end
if window >= b3 then  -- the period's end is a guess: keep the count twice that long
  expires = window + 2 * (b3 - b2)
else
  expires = ends
end
local start = b0  -- the period the clock is in
reset = b1
if now < b2 then
  if now >= b1 then start, reset = b1, b2 end
elseif now < b3 then
  start, reset = b2, b3
else
  start, reset = b3, b3 + (b3 - b2)
end
left = qrate
if window > start then
  left = 0
elseif window == start then
  left = qrate - used
  if left < 0 then left = 0 end
end
