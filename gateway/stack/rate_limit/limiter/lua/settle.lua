-- KEYS: tokens bucket. ARGV: tpm, actual - reserved (negative = refund).
local tpm, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
if tpm <= 0 or delta == 0 then return 0 end
local cap = tpm * W
local lvl = level(KEYS[1], tpm) - delta * W
-- Same bounds as the memory store: never above full, debt at most one window.
if lvl > cap then lvl = cap end
if lvl < -cap then lvl = -cap end
store(KEYS[1], tpm, lvl)
return 1
