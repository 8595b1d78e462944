--[[
Give back a slot (slot.lua): remove the lease, and when callers are queued for a slot
of the interface, announce it on the channel ARGV[2] (the message: the interface URL,
ARGV[3]) so that every process wakes its waiters of that interface at once.

A lease Redis does not know (it expired, or Redis restarted and lost it) is removed
as nothing: releasing it is harmless.

KEYS[1]  leases (slot.lua's KEYS[1]);  KEYS[2]  the queue (slot.lua's KEYS[2])
ARGV[1]  the lease id;  ARGV[2]  the channel;  ARGV[3]  the interface URL
Returns {1 if the lease was held else 0, leases still held}.
]]

local removed = redis.call("ZREM", KEYS[1], ARGV[1])
if redis.call("ZCARD", KEYS[2]) > 0 then
  redis.call("PUBLISH", ARGV[2], ARGV[3])
end
return {removed, redis.call("ZCARD", KEYS[1])}
