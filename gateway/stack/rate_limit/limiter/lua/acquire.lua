-- KEYS: the tenant's lease set. ARGV: max concurrent, lease id, lease ttl (ms).
-- A slot is a member scored by its expiry (server ms); expired leases (a crashed replica's)
-- are dropped before counting.
local max, lease, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= max then return 0 end
redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), lease)
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', 2 * ttl))
return 1
