-- KEYS: requests bucket, tokens bucket. ARGV: rpm, tpm (-1 = unlimited), tokens.
-- Returns {denied_by (0 none, 1 requests, 2 tokens, 3 tokens over budget), retry_us,
--          requests_left, requests_reset_us, tokens_left, tokens_reset_us} (-1 = unlimited).
local rpm, tpm, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local req, tok
if rpm >= 0 then req = level(KEYS[1], rpm) end
if tpm >= 0 then tok = level(KEYS[2], tpm) end

local denied, retry = 0, 0
if rpm == 0 then
  denied, retry = 1, W
elseif tpm >= 0 and n > tpm then
  denied, retry = 3, W
elseif rpm > 0 and req < W then
  denied, retry = 1, math.ceil((W - req) / rpm)
elseif tpm > 0 and tok < n * W then
  denied, retry = 2, math.ceil((n * W - tok) / tpm)
end

-- Nothing is written on denial: the check and the take are one atomic script.
if denied == 0 then
  if rpm > 0 then
    req = req - W
    store(KEYS[1], rpm, req)
  end
  if tpm > 0 and n > 0 then
    tok = tok - n * W
    store(KEYS[2], tpm, tok)
  end
end

local rl, rr, tl, tr = -1, 0, -1, 0
if rpm >= 0 then rl, rr = report(rpm, req) end
if tpm >= 0 then tl, tr = report(tpm, tok) end
return {denied, retry, rl, rr, tl, tr}
