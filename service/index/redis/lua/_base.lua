-- Fragment: the helpers every script starts with (needs nothing before it).
-- KEYS, ARGV: none of its own (those of the script that includes it).
-- CTL: the control keys' prefix; EB: the bytes of one entry. A block value is a string of
-- sorted 4-byte entries: handle (3 bytes) .. tier bits (1). Block keys come from the
-- service, concatenated (KW bytes each: keys.block_key), so the tag rule lives in keys.py
-- alone. Handles travel as 3 raw bytes inside block values (hnum/hbytes).


local CTL, EB = '${CTL}', ${ENTRY_BYTES}
local function hnum(s, i)
  local a, b, c = string.byte(s, i, i + 2)
  return (a * 256 + b) * 256 + c
end
local function hbytes(n)
  return string.char(math.floor(n / 65536), math.floor(n / 256) % 256, n % 256)
end

-- position of handle hb's entry in block value v (entries start at 1, 5, 9...), or nil
local function find(v, hb)
  local p = string.find(v, hb, 1, true)
  while p and (p - 1) % EB ~= 0 do p = string.find(v, hb, p + 1, true) end
  return p
end
