-- Writes bench/RESULTS.md from bench/results/*.json (bench/results.lua renders it), or with check=1 says
-- whether the committed file is what the JSON gives (exit 1 and the first differing line when not).
--   build/nibble run bench/gen_results.lua [check=1] [dir=bench/results] [out=bench/RESULTS.md]
local here = (debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$")) or "."
local results = dofile(here .. "/results.lua")
local dir, out = arg.dir or here .. "/results", arg.out or here .. "/RESULTS.md"

local function die(msg)
  io.stderr:write("gen_results: ", msg, "\n")
  os.exit(1)
end

local ok, text = pcall(results.generate, dir)
if not ok then die(text) end
if arg.check == "1" then
  local f = io.open(out, "rb")
  if not f then die(out .. " does not exist: run " .. results.GENERATED_BY) end
  local have = f:read("*a")
  f:close()
  local diff = results.first_difference(text, have)
  if diff then die(("%s is not what %s/*.json give (%s): run %s"):format(out, dir, diff, results.GENERATED_BY)) end
  print(out .. " matches " .. dir .. "/*.json")
else
  local f = io.open(out, "wb") or die("cannot write " .. out)
  f:write(text)
  f:close()
  print("wrote " .. out)
end
