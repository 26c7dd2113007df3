-- nibble run: run a Lua script or a recipe (key=value arguments; NIBBLE_DEBUG=1 for tracebacks)
-- The host runs the file itself (lua/host/main.c); this module is the usage text it prints for
-- `nibble run`, `nibble run -h` and `nibble run --help`.
local USAGE = [[
usage: nibble run FILE [key=value ...] [ARGS ...]      (or: nibble FILE.lua ...)
  FILE is a Lua script, or a recipe: a file that returns nibble.recipe{...} (PTQ; QAD when it has a
  distill section), run by nibble.pipeline.execute. FILE - reads stdin. key=value arguments reach the
  file as arg.key (strings), the others as arg[1], arg[2], ...
  nibble run RECIPE --help prints a recipe's own keys (recipes/qad.lua, recipes/quickstart.lua); an
  unknown key, a bad value or an impossible request is refused before any compute.
errors: a refused request prints one line, "nibble: MESSAGE", and exits 1; any other error (a bug)
  also prints the Lua stack traceback. NIBBLE_DEBUG=1 prints the traceback for every error.
  Ctrl-C stops the run: "nibble: interrupted", exit code 130, no traceback (QAD recipes save a
  checkpoint first: run again with resume=true). After the export finished, Ctrl-C says "interrupted
  after the export was complete: DIR is complete and usable" and still exits 130 (what came after
  the export, such as the eval table, did not run).
environment: NIBBLE_THREADS (threads), NIBBLE_DEBUG=1 (tracebacks), NIBBLE_RECIPES (recipe folders,
  searched before recipes/), NIBBLE_LUA_PATH (extra module path)
]]

return function(args)
  local a = args[1]
  if a == "-h" or a == "--help" then
    io.stdout:write(USAGE)
    return 0
  end
  io.stderr:write(a and ("nibble run: the nibble program runs files itself: nibble run %s\n"):format(a) or "", USAGE)
  return 1
end
