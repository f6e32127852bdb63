-- KEYS: the tenant's lease set. ARGV: lease ttl (ms), lease ids held by this replica.
-- XX: a lease released meanwhile must not come back.
local ttl = tonumber(ARGV[1])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expiry = string.format('%.0f', now + ttl)
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', 2 * ttl))
return #ARGV - 1
