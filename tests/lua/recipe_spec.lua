-- Recipe matcher and validation: globs, last-match-wins, extends/units, every validation error
-- (with did-you-mean), block-size exclusions vs explicit requests, tied lm_head, and plan text.
local recipe = require "nibble.recipe"
local nbspec = require("nbspec")

local src = os.getenv("NIBBLE_SOURCE_DIR") or "."
recipe.search_path = { src .. "/recipes" }

-- stories260K's linear modules (dim 64, hidden 172, 5 layers, tied embeddings)
local function stories_modules(untied)
  local mods = { { name = "model.embed_tokens", kind = "embedding" } }
  for l = 0, 4 do
    local p = "model.layers." .. l
    mods[#mods + 1] = { name = p .. ".input_layernorm", kind = "norm" }
    for _, n in ipairs { "q_proj", "k_proj", "v_proj", "o_proj" } do
      mods[#mods + 1] = { name = p .. ".self_attn." .. n, kind = "linear", in_features = 64, out_features = 64 }
    end
    mods[#mods + 1] = { name = p .. ".post_attention_layernorm", kind = "norm" }
    mods[#mods + 1] = { name = p .. ".mlp.gate_proj", kind = "linear", in_features = 64, out_features = 172 }
    mods[#mods + 1] = { name = p .. ".mlp.up_proj", kind = "linear", in_features = 64, out_features = 172 }
    mods[#mods + 1] = { name = p .. ".mlp.down_proj", kind = "linear", in_features = 172, out_features = 64 }
  end
  mods[#mods + 1] = { name = "model.norm", kind = "norm" }
  mods[#mods + 1] = { name = "lm_head", kind = "linear", in_features = 64, out_features = 512, tied = not untied }
  return mods
end

local function by_name(plan)
  local t = {}
  for _, e in ipairs(plan) do t[e.name] = e end
  return t
end

local err_of = nbspec.err_of

describe("globs", function()
  it("match like fnmatch", function()
    assert.is_true(recipe.glob_match("*", "model.layers.0.mlp.up_proj"))
    assert.is_true(recipe.glob_match("*.mlp.*", "model.layers.0.mlp.up_proj"))
    assert.is_false(recipe.glob_match("*.mlp.*", "model.layers.0.self_attn.q_proj"))
    assert.is_true(recipe.glob_match("model.layers.?.self_attn.[qk]_proj", "model.layers.3.self_attn.k_proj"))
    assert.is_false(recipe.glob_match("model.layers.?.self_attn.[qk]_proj", "model.layers.3.self_attn.v_proj"))
    assert.is_false(recipe.glob_match("lm_head", "model.lm_head"))
    assert.is_true(recipe.glob_match("*lm_head*", "model.lm_head"))
    -- dots and other magic characters are literal
    assert.is_false(recipe.glob_match("model.layers.1", "modelXlayersX1"))
    assert.is_true(recipe.glob_match("a+b%c", "a+b%c"))
  end)
end)

describe("resolve", function()
  it("applies the unit, excludes down_proj for its 172 width and the tied lm_head", function()
    local r = recipe.compose(recipe.new { extends = "units/nvfp4_w4a16" })
    local plan = by_name(recipe.resolve(r, stories_modules()))
    assert.equal("nvfp4_w4a16", plan["model.layers.0.self_attn.q_proj"].format)
    assert.equal("nvfp4_w4a16", plan["model.layers.4.mlp.gate_proj"].format)
    assert.is_nil(plan["model.layers.2.mlp.down_proj"].format)
    assert.equal("in_features 172 is not divisible by the nvfp4 block size 16",
      plan["model.layers.2.mlp.down_proj"].reason)
    assert.is_nil(plan["lm_head"].format)
    assert.matches("default exclusion", plan["lm_head"].reason)
    assert.equal("norm (no quantizer)", plan["model.norm"].reason)
  end)

  it("last match wins: per-module formats and exclusions", function()
    local r = recipe.compose(recipe.new {
      extends = "units/nvfp4",
      quantize = { { "*.mlp.*", "mxfp8" }, { "model.layers.0.*", false } },
    })
    local plan = by_name(recipe.resolve(r, stories_modules()))
    assert.equal("nvfp4", plan["model.layers.1.self_attn.o_proj"].format)
    assert.equal("mxfp8", plan["model.layers.1.mlp.up_proj"].format)
    assert.is_nil(plan["model.layers.0.mlp.up_proj"].format)
    assert.matches("excluded by rule 2 'model.layers.0.%*'", plan["model.layers.0.mlp.up_proj"].reason)
    -- mxfp8 blocks are 32 wide: 172 is not a multiple either
    assert.equal("in_features 172 is not divisible by the mxfp8 block size 32",
      plan["model.layers.3.mlp.down_proj"].reason)
  end)

  it("quantizes an untied lm_head when asked by name", function()
    local r = recipe.compose(recipe.new { extends = "units/nvfp4_w4a16", quantize = { { "lm_head", "nvfp4_w4a16" } } })
    local plan = by_name(recipe.resolve(r, stories_modules(true)))
    assert.equal("nvfp4_w4a16", plan["lm_head"].format)
  end)

  it("refuses to quantize a tied lm_head by name", function()
    local r = recipe.compose(recipe.new { extends = "units/nvfp4_w4a16", quantize = { { "lm_head", "nvfp4_w4a16" } } })
    assert.matches("tied to the embeddings", err_of(recipe.resolve, r, stories_modules()))
  end)

  it("an explicit request for a module the block size cannot divide is an error", function()
    local r = recipe.compose(recipe.new { quantize = { { "model.layers.1.mlp.down_proj", "nvfp4" } } })
    assert.equal("recipe: rule 1 'model.layers.1.mlp.down_proj' asks for nvfp4 on model.layers.1.mlp.down_proj, "
      .. "but in_features 172 is not divisible by the nvfp4 block size 16", err_of(recipe.resolve, r, stories_modules()))
  end)

  it("a rule that matches nothing is an error with a suggestion", function()
    local r = recipe.compose(recipe.new { extends = "units/nvfp4", quantize = { { "model.layers.0.mlp.up_prj", "fp8" } } })
    assert.equal("recipe: rule 1 'model.layers.0.mlp.up_prj' matches no module (did you mean 'model.layers.0.mlp.up_proj'?)",
      err_of(recipe.resolve, r, stories_modules()))
  end)

  it("a glob rule whose every module is too narrow for its block is an error naming the rule", function()
    local r = recipe.compose(recipe.new { extends = "units/nvfp4_w4a16", quantize = { { "*.mlp.down_proj", "nvfp4_w4a16" } } })
    assert.equal("recipe: rule 1 '*.mlp.down_proj' (nvfp4_w4a16) matches 5 modules but can quantize none of them: "
      .. "in_features 172 is not divisible by the nvfp4 block size 16 (model.layers.0.mlp.down_proj, "
      .. "model.layers.1.mlp.down_proj, model.layers.2.mlp.down_proj and 2 more)", err_of(recipe.resolve, r, stories_modules()))
    -- a tied lm_head is no place for a rule either
    r = recipe.compose(recipe.new { quantize = { { "lm_he*", "fp8" } } })
    assert.equal("recipe: rule 1 'lm_he*' (fp8) matches 1 module but can quantize none of them: "
      .. "tied to model.embed_tokens (not quantized) (lm_head)", err_of(recipe.resolve, r, stories_modules()))
  end)

  it("a rule that applies to some of its modules notes the others with the reason", function()
    local r = recipe.compose(recipe.new { extends = "units/nvfp4_w4a16", quantize = { { "*.mlp.*", "mxfp8" } } })
    local plan, notes = recipe.resolve(r, stories_modules())
    assert.equal("mxfp8", by_name(plan)["model.layers.3.mlp.up_proj"].format)
    -- the unit's '*' now wins only the attention projections, which all take it
    assert.same({
      "rule 1 '*.mlp.*' (mxfp8) leaves 5 of its 15 modules unquantized: in_features 172 is not divisible by the "
        .. "mxfp8 block size 32 (model.layers.0.mlp.down_proj, model.layers.1.mlp.down_proj, "
        .. "model.layers.2.mlp.down_proj and 2 more)",
    }, notes)
    -- the unit alone: its '*' (5 layers x 7 projections; lm_head is a default exclusion) skips down_proj
    _, notes = recipe.resolve(recipe.compose(recipe.new { extends = "units/nvfp4_w4a16" }), stories_modules())
    assert.same({ "rule 1 of units/nvfp4_w4a16 '*' (nvfp4_w4a16) leaves 5 of its 35 modules unquantized: in_features "
      .. "172 is not divisible by the nvfp4 block size 16 (model.layers.0.mlp.down_proj, model.layers.1.mlp.down_proj, "
      .. "model.layers.2.mlp.down_proj and 2 more)" }, notes)
    -- every module taking its rule: no notes
    local _, none = recipe.resolve(recipe.compose(recipe.new { quantize = { { "*.self_attn.*", "fp8" } } }), stories_modules())
    assert.same({}, none)
  end)

  it("algorithm four_over_six turns each NVFP4 preset into its 4/6 variant, and leaves the others", function()
    for from, to in pairs { nvfp4_w4a16 = "nvfp4_4o6", nvfp4 = "nvfp4_4o6_a4", nvfp4_static = "nvfp4_4o6",
                            nvfp4_4o6 = "nvfp4_4o6", nvfp4_4o6_a4 = "nvfp4_4o6_a4", mxfp8 = "mxfp8", fp8 = "fp8",
                            fp8_per_channel = "fp8_per_channel" } do
      local r = recipe.compose(recipe.new { algorithm = "four_over_six", quantize = { { "*.self_attn.*", from } } })
      local e = by_name(recipe.resolve(r, stories_modules()))["model.layers.0.self_attn.k_proj"]
      assert.equal(to, e.format, from)
      assert.equal(recipe.presets[to], e.preset, from)
    end
    -- other algorithms keep the preset
    local r = recipe.compose(recipe.new { algorithm = "mse", quantize = { { "*.self_attn.*", "nvfp4_w4a16" } } })
    assert.equal("nvfp4_w4a16", by_name(recipe.resolve(r, stories_modules()))["model.layers.0.self_attn.q_proj"].format)
  end)

  it("unit rules that match nothing (routers in a dense model) are fine", function()
    local r = recipe.compose(recipe.new { extends = "units/fp8" })
    local plan = recipe.resolve(r, stories_modules())
    assert.equal(#stories_modules(), #plan)
  end)
end)

describe("presets come from libnibble's descriptor rows (nibble/formats.h)", function()
  local ffi = require("ffi")
  local C = require("nibble").C
  it("every preset row, and nothing else, with its formats, quant_algo and variant", function()
    local seen = 0
    for i = 0, C.nb_preset_count() - 1 do
      local d = C.nb_preset_at(i)
      local name = ffi.string(d.name)
      if d.kind == C.NB_PRESET_LINEAR then
        local p = recipe.presets[name]
        assert.is_table(p, name)
        seen = seen + 1
        assert.equal(ffi.string(C.nb_format_desc_of(d.weight_format).name), p.weight_format)
        assert.equal(ffi.string(C.nb_preset_quant_algo(d)), p.quant_algo)
        assert.equal(tonumber(C.nb_format_desc_of(d.weight_format).block_size), p.block)
        assert.equal(ffi.string(d.weight_kind), p.weight)
        assert.equal(d.weight_static ~= 0, p.static)
        assert.equal(d.input_format ~= 0 and ffi.string(C.nb_format_desc_of(d.input_format).name) or nil, p.input)
        assert.equal(d.four_over_six ~= nil and ffi.string(d.four_over_six) or nil, p.variant_4o6)
      else
        assert.is_table(recipe.kv_presets[name], name)
      end
    end
    local n = 0
    for _ in pairs(recipe.presets) do n = n + 1 end
    assert.equal(seen, n)
    -- the values FORMATS.md gives (§3.2): a few spelled out
    assert.same({ "nvfp4", 16, "dynamic", "nvfp4", "NVFP4" }, { recipe.presets.nvfp4.format, recipe.presets.nvfp4.block,
      recipe.presets.nvfp4.weight, recipe.presets.nvfp4.input, recipe.presets.nvfp4.quant_algo })
    assert.same({ "nvfp4", "nvfp4_46", true, "W4A16_NVFP4" }, { recipe.presets.nvfp4_4o6.format,
      recipe.presets.nvfp4_4o6.weight_format, recipe.presets.nvfp4_4o6.four_over_six, recipe.presets.nvfp4_4o6.quant_algo })
    assert.equal("FP8_PER_CHANNEL_PER_TOKEN", recipe.presets.fp8_per_channel.quant_algo)
    assert.equal("FP8", recipe.kv_presets.fp8.quant_algo)
  end)

  it("algorithms are the C calibration methods, by name", function()
    assert.same({ max = C.NB_CALIB_MAX, mse = C.NB_CALIB_MSE, four_over_six = C.NB_CALIB_FOUR_OVER_SIX }, recipe.algorithms)
  end)
end)

describe("recipes/ptq.lua", function()
  it("has a unit for every preset (each quantizes the attention projections in that format)", function()
    local names = {}
    for k in pairs(recipe.presets) do names[#names + 1] = k end
    table.sort(names)
    assert.is_true(#names >= 8)
    for _, f in ipairs(names) do
      local r = recipe.load(src .. "/recipes/ptq.lua", { format = f, model = "unused" })
      local plan = by_name(recipe.resolve(recipe.compose(r), stories_modules()))
      assert.are.equal(f, plan["model.layers.0.self_attn.q_proj"].format, f)
      assert.is_nil(plan["lm_head"].format, f)
    end
  end)
end)

describe("validation", function()
  local mods = stories_modules()
  it("unknown top-level key, with did-you-mean", function()
    assert.equal("recipe: unknown key 'algoritm' in the recipe (did you mean 'algorithm'?)",
      err_of(recipe.resolve, recipe.new { algoritm = "max" }, mods))
  end)
  it("unknown nested key", function()
    assert.equal("recipe: unknown key 'sample' in 'calibration' (did you mean 'samples'?)",
      err_of(recipe.resolve, recipe.new { calibration = { sample = 4 } }, mods))
  end)
  it("unknown format", function()
    assert.matches("unknown format 'nvfp5' %(did you mean 'nvfp4'%?%)",
      err_of(recipe.resolve, recipe.new { quantize = { { "*", "nvfp5" } } }, mods))
  end)
  it("unknown algorithm and layout", function()
    assert.matches("unknown algorithm 'mse2'", err_of(recipe.resolve, recipe.new { algorithm = "mse2" }, mods))
    assert.matches("unknown export layout 'modelop' %(did you mean 'modelopt'%?%)",
      err_of(recipe.resolve, recipe.new { export = { layout = "modelop" } }, mods))
  end)
  it("export.dtype: bf16, f16 or f32; anything else is refused with did-you-mean", function()
    assert.equal("recipe: unknown export dtype 'bf61' (did you mean 'bf16'?); known: bf16, f16, f32",
      err_of(recipe.resolve, recipe.new { export = { dtype = "bf61" } }, mods))
    for _, d in ipairs { "bf16", "f16", "f32" } do
      assert.are.equal(d, recipe.compose(recipe.new { export = { dtype = d } }).export.dtype)
    end
  end)
  it("bad rule shapes", function()
    assert.matches("first element must be a glob", err_of(recipe.resolve, recipe.new { quantize = { { 3, "fp8" } } }, mods))
    assert.matches("must be a preset name or false", err_of(recipe.resolve, recipe.new { quantize = { { "*", true } } }, mods))
    assert.matches("'quantize' must be a list", err_of(recipe.resolve, recipe.new { quantize = "fp8" }, mods))
  end)
  it("kv_cache: fp8 or false; anything else is refused with did-you-mean; units/kv_fp8 sets it", function()
    assert.equal("recipe: unknown kv_cache 'fp9' (did you mean 'fp8'?); known: fp8 (or false)",
      err_of(recipe.resolve, recipe.new { kv_cache = "fp9" }, mods))
    assert.equal("recipe: unknown kv_cache 'true'; known: fp8 (or false)",
      err_of(recipe.resolve, recipe.new { kv_cache = true }, mods))
    recipe.resolve(recipe.new { kv_cache = false }, mods)
    local r = recipe.compose(recipe.new { extends = { "units/nvfp4", "units/kv_fp8" } })
    assert.equal("fp8", r.kv_cache)
    assert.equal("fp8", recipe.kv_presets[r.kv_cache].format)
    assert.equal("nvfp4", by_name(recipe.resolve(r, mods))["model.layers.0.self_attn.k_proj"].format)
    -- a later recipe turns it off again
    assert.is_false(recipe.compose(recipe.new { extends = "units/kv_fp8", kv_cache = false }).kv_cache)
  end)
  it("extends that does not exist, and cycles", function()
    assert.matches("extends 'units/nope': no such recipe or unit",
      err_of(recipe.compose, recipe.new { extends = "units/nope" }))
  end)
end)

describe("plan text", function()
  it("lists every module with its format or reason, and a summary", function()
    local r = recipe.compose(recipe.new { extends = "units/nvfp4_w4a16" })
    local text = recipe.format_plan(recipe.resolve(r, stories_modules()))
    assert.matches("model.layers.0.self_attn.q_proj%s+nvfp4_w4a16\n", text)
    assert.matches("model.layers.0.mlp.down_proj%s+%-%s+in_features 172 is not divisible", text)
    assert.matches("\n48 modules %(excluded: 18, nvfp4_w4a16: 30%)$", text)
  end)
end)

describe("recipe.args (the key=value arguments of recipes/qad.lua and recipes/quickstart.lua)", function()
  local known = { "steps", "lr", "resume", "format" }
  it("reads strings, numbers and booleans, with defaults", function()
    local a = recipe.args({ [0] = "x.lua", [-1] = "nibble", steps = "50", lr = "3e-5", resume = "1", format = "mxfp8" },
                          "x.lua", known)
    assert.equal(50, a.num("steps", 200))
    assert.equal(3e-5, a.num("lr"))
    assert.is_true(a.bool("resume", false))
    assert.equal("mxfp8", a.str("format", "nvfp4"))
    assert.is_true(a.given("steps"))
    local d = recipe.args({}, "x.lua", known)
    assert.equal(200, d.num("steps", 200))
    assert.is_nil(d.num("lr"))
    assert.is_false(d.bool("resume", false))
    assert.is_false(d.given("steps"))
  end)
  it("refuses an unknown key with did-you-mean, and a word that is not key=value", function()
    assert.equal("x.lua: unknown key 'stpes' (did you mean 'steps'?); --help lists the keys",
      err_of(recipe.args, { stpes = "5" }, "x.lua", known))
    assert.equal("x.lua: unknown key 'zzzzzz'; --help lists the keys", err_of(recipe.args, { zzzzzz = "1" }, "x.lua", known))
    assert.equal("x.lua: unexpected argument 'steps' (arguments are key=value)",
      err_of(recipe.args, { "steps" }, "x.lua", known))
  end)
  it("names a bad number or boolean", function()
    local a = recipe.args({ steps = "many", lr = "nan", resume = "yes", format = "inf" }, "x.lua", known)
    assert.equal("x.lua: steps must be a number, got 'many'", err_of(a.num, "steps"))
    assert.equal("x.lua: lr must be a number, got 'nan'", err_of(a.num, "lr"))
    assert.equal("x.lua: format must be a number, got 'inf'", err_of(a.num, "format"))
    assert.equal("x.lua: resume must be true or false, got 'yes'", err_of(a.bool, "resume"))
  end)
  it("--help prints the recipe file's leading comment and returns nil", function()
    local file = nbspec.tmpname(".lua")
    nbspec.write(file, "-- demo: a recipe\n--   nibble run demo.lua steps=N\nlocal a = recipe.args(arg, 'demo', { 'steps' })\n"
                       .. "if not a then return nil end\nreturn { quantize = {} }\n")
    local out = {}
    local so = io.stdout
    io.stdout = { write = function(_, ...) for _, s in ipairs({ ... }) do out[#out + 1] = s end end }
    local ok, r = pcall(recipe.load, file, { "--help", steps = "3" })
    io.stdout = so
    os.remove(file)
    assert.is_true(ok, r)
    assert.is_nil(r)
    assert.equal("demo: a recipe\n  nibble run demo.lua steps=N\n", table.concat(out))
  end)
end)
