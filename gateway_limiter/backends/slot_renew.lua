--[[
Renew a process's leases on one interface (slot.lua) in one call: each lease still
held runs ARGV[1] ms from now (the server's clock). A lease no longer held (expired,
released, lost with a Redis restart) is not brought back, so a renewal can never count
a slot that Redis has already given to someone else.

KEYS[1]  leases (slot.lua's KEYS[1]);  KEYS[2]  unclaimed grants (slot.lua's KEYS[6]): a
         lapsed lease's grant goes with it
ARGV[1]  lease in ms;  ARGV[2..]  the lease ids (none: only count)
Returns {leases renewed, live leases of the interface}.
]]

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = now_ms + tonumber(ARGV[1])
local lapsed = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", now_ms)
if #lapsed > 0 then
  redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now_ms)
  redis.call("HDEL", KEYS[2], unpack(lapsed))
end
local renewed = 0
for i = 2, #ARGV do
  local held = redis.call("ZSCORE", KEYS[1], ARGV[i])
  if held then
    -- never shorten a lease that runs past a rate wait (ZADD GT, without Redis 6.2)
    if tonumber(held) < until_ms then redis.call("ZADD", KEYS[1], until_ms, ARGV[i]) end
    renewed = renewed + 1
  end
end
if renewed > 0 and redis.call("PTTL", KEYS[1]) < tonumber(ARGV[1]) + 1000 then
  redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[1]) + 1000)
end
return {renewed, redis.call("ZCARD", KEYS[1])}
