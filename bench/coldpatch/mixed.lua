-- A mixed interpreter workload for the disabled-cost benchmark: function
-- calls and closures, table inserts and lookups, string building and
-- pattern matching, a little floating point.  `lua mixed.lua SCALE`.
local scale = tonumber(arg[1]) or 1

local function fib(n) if n < 2 then return n end return fib(n - 1) + fib(n - 2) end

local function tables(n)
  local t, sum = {}, 0
  for i = 1, n do t[i] = i * 2 end
  for k = 1, n do t["k" .. (k % 1000)] = k end
  for _, v in ipairs(t) do sum = sum + v end
  table.sort(t, function(a, b) return a > b end)
  return sum + #t
end

local function strings(n)
  local parts = {}
  for i = 1, n do parts[#parts + 1] = string.format("%d:%s", i, tostring(i * 7)) end
  local s = table.concat(parts, ",")
  local count = 0
  for a, b in s:gmatch("(%d+):(%d+)") do count = count + (tonumber(b) - tonumber(a)) % 3 end
  return count + #s:upper()
end

local function closures(n)
  local acc = 0
  local function make(k) return function(x) return x * k + 1 end end
  for i = 1, n do acc = (acc + make(i % 17)(i)) % 1000003 end
  return acc
end

local function floats(n)
  local x = 0.0
  for i = 1, n do x = x + math.sin(i) * math.sqrt(i) end
  return x
end

local total = 0
for _ = 1, scale do
  total = total + fib(24) + tables(60000) + strings(40000) + closures(200000) + floats(200000)
end
print(string.format("%.3f", total))
