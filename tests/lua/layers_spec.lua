-- The Lua modules in layers: bindings at the bottom (the FFI module, tensors, models, data, formats),
-- the pipeline above (recipe, calibration, PTQ, QAD, its guards and losses), the command line on top.
-- A module may use its own layer and the ones below: never one above, and no cycle (a `require`
-- inside a function counts, as does `nibble.<module>`, the FFI module's lazy access to a submodule).
-- Every lua/nibble/*.lua and lua/nibble/cli/*.lua is read as text; a new module must be given a layer.
local util = require("nibble.util")

local ROOT = "lua/nibble"
local LAYERS = {
  bindings = { "nibble", "nibble.util", "nibble.json", "nibble.chat", "nibble.tokenizer", "nibble.weights",
               "nibble.model", "nibble.data", "nibble.optim", "nibble.quant", "nibble.qmodel",
               "nibble.formats", "nibble.comm" },
  pipeline = { "nibble.qad_settings", "nibble.recipe", "nibble.distill", "nibble.ptq", "nibble.qad_guard",
               "nibble.qad", "nibble.pipeline" },
  cli = { "nibble.cli", "nibble.repl" },   -- and every nibble.cli.<command>
}
local RANK = { bindings = 1, pipeline = 2, cli = 3 }
-- modules outside lua/nibble that the host or the build provides (the bottom layer's own parts)
local PROVIDED = { ["nibble.cdef"] = true, ["nibble.host"] = true, ["nibble.buildinfo"] = true }

local layer_of = {}
for name, mods in pairs(LAYERS) do for _, m in ipairs(mods) do layer_of[m] = name end end
local function layer(m)
  if layer_of[m] then return layer_of[m] end
  if m:match("^nibble%.cli%.") then return "cli" end
  return nil
end

-- scan(text): the source with comments and the contents of strings blanked, and the list of the
-- string literals that are a require's argument (require("x"), require "x", pcall(require, "x")).
local function scan(text)
  local out, reqs, i, n = {}, {}, 1, #text
  local function long_bracket(at)
    local eq = text:match("^%[(=*)%[", at)
    if not eq then return nil end
    local close = "]" .. eq .. "]"
    local e = text:find(close, at, true)
    return e and (e + #close - 1) or n
  end
  while i <= n do
    local c = text:sub(i, i)
    if text:sub(i, i + 1) == "--" then
      local e = long_bracket(i + 2)
      if not e then e = (text:find("\n", i, true) or n + 1) - 1 end
      out[#out + 1] = " "
      i = e + 1
    elseif c == '"' or c == "'" then
      local j = i + 1
      while j <= n and text:sub(j, j) ~= c do
        if text:sub(j, j) == "\\" then j = j + 1 end
        j = j + 1
      end
      local lit = text:sub(i + 1, j - 1)
      local before = table.concat(out):sub(-40)
      if before:match("require%s*%(?%s*$") or before:match("pcall%(%s*require%s*,%s*$") then
        reqs[#reqs + 1] = lit
      end
      out[#out + 1] = c .. c
      i = j + 1
    elseif c == "[" and long_bracket(i) then
      out[#out + 1] = '""'
      i = long_bracket(i) + 1
    else
      out[#out + 1] = c
      i = i + 1
    end
  end
  return table.concat(out), reqs
end

-- modules(): every module file as {name, path}; edges_of(list): module -> {dependency = true}.
local function modules()
  local list = {}
  for _, f in ipairs(util.listdir(ROOT) or {}) do
    local stem = f:match("^(.+)%.lua$")
    if stem then list[#list + 1] = { name = stem == "init" and "nibble" or "nibble." .. stem, path = ROOT .. "/" .. f } end
  end
  for _, f in ipairs(util.listdir(ROOT .. "/cli") or {}) do
    local stem = f:match("^(.+)%.lua$")
    if stem then
      list[#list + 1] = { name = stem == "init" and "nibble.cli" or "nibble.cli." .. stem, path = ROOT .. "/cli/" .. f }
    end
  end
  table.sort(list, function(a, b) return a.name < b.name end)
  return list
end

local function edges_of(list)
  local known = {}
  for _, m in ipairs(list) do known[m.name] = true end
  local edges = {}
  for _, m in ipairs(list) do
    local f = assert(io.open(m.path, "rb"))
    local code, reqs = scan(f:read("*a"))
    f:close()
    local deps = {}
    for _, r in ipairs(reqs) do
      if r:match("^nibble") then deps[r] = true end
    end
    -- nibble.<name>: a submodule the FFI module loads on first access (nibble.distill.config(...))
    for name in code:gmatch("[^%w_%.]nibble%.([%a_][%w_]*)") do
      if known["nibble." .. name] then deps["nibble." .. name] = true end
    end
    deps[m.name] = nil
    edges[m.name] = deps
  end
  return edges
end

describe("Lua layers", function()
  local list = modules()
  local edges = edges_of(list)

  it("finds the modules and the requires inside functions", function()
    assert.is_true(#list >= 25, "modules found: " .. #list)
    -- a require inside a function of a pipeline module counts: ptq loads the model module in load_model
    assert.is_true(edges["nibble.ptq"]["nibble.model"] == true)
    assert.is_true(edges["nibble.qad"]["nibble.distill"] == true)
    assert.is_true(edges["nibble.cli.qad"]["nibble.qad"] == true)
    -- the scanner: comments and strings other than a require's argument are not edges
    local code, reqs = scan('-- require("nibble.cli")\nlocal s = "nibble.qad" local x = require("nibble.ptq")\n'
      .. 'local ok, m = pcall(require, "nibble.recipe") --[[ require("nibble.repl") ]] local y = require "nibble.json"')
    assert.are.same({ "nibble.ptq", "nibble.recipe", "nibble.json" }, reqs)
    assert.is_nil(code:find("nibble.qad", 1, true))
  end)

  it("gives every module a layer", function()
    for _, m in ipairs(list) do
      assert(layer(m.name), ("%s (%s) has no layer: add it to LAYERS in tests/lua/layers_spec.lua"):format(m.name, m.path))
    end
  end)

  it("has no upward edge: a module uses its own layer and the ones below", function()
    local bad = {}
    for _, m in ipairs(list) do
      for dep in pairs(edges[m.name]) do
        local ld = layer(dep) or (PROVIDED[dep] and "bindings")
        assert(ld, ("%s requires %s, which is no module of lua/nibble"):format(m.name, dep))
        if RANK[ld] > RANK[layer(m.name)] then
          bad[#bad + 1] = ("%s (%s) -> %s (%s)"):format(m.name, layer(m.name), dep, ld)
        end
      end
    end
    table.sort(bad)
    assert(#bad == 0, "upward edges: " .. table.concat(bad, "; "))
  end)

  it("has no cycle", function()
    local state, stack, found = {}, {}, nil
    local function visit(m)
      if found then return end
      state[m] = "open"
      stack[#stack + 1] = m
      local deps = util.keys_of(edges[m] or {})
      for _, d in ipairs(deps) do
        if state[d] == "open" then
          local cyc, on = {}, false
          for _, s in ipairs(stack) do
            if s == d then on = true end
            if on then cyc[#cyc + 1] = s end
          end
          cyc[#cyc + 1] = d
          found = table.concat(cyc, " -> ")
          return
        elseif state[d] == nil and edges[d] then
          visit(d)
        end
      end
      stack[#stack] = nil
      state[m] = "done"
    end
    for _, m in ipairs(list) do if not state[m.name] then visit(m.name) end end
    assert(found == nil, "require cycle: " .. tostring(found))
  end)
end)
