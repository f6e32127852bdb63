-- Shared prelude (prepended to reserve.lua and settle.lua; see tenant/redis.rs).
-- A bucket of limit L holds L*W ticks (W = one minute in µs), refills L ticks per µs and
-- spends W ticks per unit. Every value stays an integer below 2^53 for L <= 1.5e8, so
-- Lua's doubles compute exactly. Time is the server's (TIME), so replicas agree.
local W = 60000000
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

-- The level now: the stored level plus the refill since, at most the capacity.
local function level(key, limit)
  local cap = limit * W
  local v = redis.call('HMGET', key, 'l', 't')
  local lvl, ts = tonumber(v[1]), tonumber(v[2])
  if not lvl or not ts then return cap end
  local elapsed = now - ts
  -- A server clock stepped back (failover to a replica) refills nothing instead of negative.
  if elapsed < 0 then elapsed = 0 end
  -- Debt is at most one window, so three windows refill anything; this keeps the product exact.
  if elapsed > 3 * W then elapsed = 3 * W end
  return math.min(cap, lvl + elapsed * limit)
end

-- Numbers must be formatted by hand: Lua's tostring keeps only 14 significant digits.
local function int(x) return string.format('%.0f', x) end

local function store(key, limit, lvl)
  redis.call('HSET', key, 'l', int(lvl), 't', int(now))
  -- A full bucket is the same as no key: let idle tenants vanish once refilled.
  local ttl_ms = math.ceil((limit * W - lvl) / limit / 1000) + 1000
  redis.call('PEXPIRE', key, int(ttl_ms))
end

-- Whole units left, and µs until full.
local function report(limit, lvl)
  if limit == 0 then return 0, 0 end
  local left = math.floor(math.max(lvl, 0) / W)
  return left, math.ceil((limit * W - lvl) / limit)
end
