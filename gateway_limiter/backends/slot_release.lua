--[[
Give back a slot (slot.lua), or a place in the queue that a caller gives up (its wait
budget ran out, it was cancelled): remove the lease and the place, and when callers are
queued for a slot
of the interface, announce it on the channel ARGV[2] (the message: the interface URL,
ARGV[3]) so that every process wakes its waiters of that interface at once.

A lease Redis does not know (it expired, or Redis restarted and lost it) is removed
as nothing: releasing it is harmless.

KEYS[1]  leases, KEYS[2]  the queue, KEYS[3]  its lapses (slot.lua's KEYS[1..3])
ARGV[1]  the lease id;  ARGV[2]  the channel;  ARGV[3]  the interface URL
Returns {1 if the lease was held else 0, leases still held}.
]]

local removed = redis.call("ZREM", KEYS[1], ARGV[1])
redis.call("ZREM", KEYS[2], ARGV[1])
redis.call("ZREM", KEYS[3], ARGV[1])
if redis.call("ZCARD", KEYS[2]) > 0 then
  redis.call("PUBLISH", ARGV[2], ARGV[3])
end
return {removed, redis.call("ZCARD", KEYS[1])}
