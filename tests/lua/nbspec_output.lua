-- The busted output handler of nibble's specs (`--output=tests/lua/nbspec_output.lua`): busted's gtest
-- report, then one closing line that counts the cases passed, failed and skipped (pending), and how
-- many of the skips were for missing test data. busted counts a skipped case as no failure, so a spec
-- whose cases were all skipped would pass: it exits 77 instead, which ctest reports as Skipped.
local nbspec = require("nbspec")

return function(options)
  local busted = require("busted")
  local handler = require("busted.outputHandlers.gtest")(options)
  busted.subscribe({ "exit" }, function()
    -- busted prefixes the reason with the file:line that called pending; one line per distinct reason
    local data, reasons, count = 0, {}, {}
    for _, p in ipairs(handler.pendings) do
      local why = tostring(p.message):gsub("^[^\n]-:%d+: ", "")
      if why:sub(1, #nbspec.DATA_SKIP) == nbspec.DATA_SKIP then data = data + 1 end
      if not count[why] then reasons[#reasons + 1] = why end
      count[why] = (count[why] or 0) + 1
    end
    for _, why in ipairs(reasons) do io.write(("busted: %d skipped: %s\n"):format(count[why], why)) end
    local failed = handler.failuresCount + handler.errorsCount
    local parts = nbspec.parts > 0 and (", %d ran in part"):format(nbspec.parts) or ""
    io.write(("busted: %d passed, %d failed, %d skipped (%d for missing test data%s)\n"):format(
      handler.successesCount, failed, handler.pendingsCount, data, parts))
    io.flush()
    if handler.pendingsCount > 0 and handler.successesCount == 0 and failed == 0 then
      os.exit(77, true)
    end
    return nil, true
  end)
  return handler
end
