-- Helpers shared by the busted specs in tests/lua: test data paths (nil when a file of the test data
-- folder is absent, so that a case skips with `need`, naming the files), running the built `nibble`
-- program with its stdout, stderr and exit code, temporary files and directories, shell quoting,
-- `err_of` for expected errors, and `kv_order_tol`, how far a calibrated K/V amax may move with the
-- summation order.
local M = {}

M.source_dir = os.getenv("NIBBLE_SOURCE_DIR") or "."
M.build_dir = os.getenv("NIBBLE_BUILD_DIR") or "build"
M.bin = os.getenv("NIBBLE_BIN") or (M.build_dir .. "/nibble")
M.shared = os.getenv("NIBBLE_SHARED_DATA") or (M.source_dir .. "/../shared/data")

function M.exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- Test data files this spec asked for and did not find, in order: `need` names them.
M.missing = {}

-- Path of a test data file (or of a model folder), or nil when it is missing.
function M.data(rel)
  local p = M.shared .. "/" .. rel
  if M.exists(p) or M.exists(p .. "/config.json") then return p end
  for _, m in ipairs(M.missing) do
    if m == rel then return nil end
  end
  M.missing[#M.missing + 1] = rel
  return nil
end

-- The start of every skip message for missing test data (nbspec_output.lua counts those skips).
M.DATA_SKIP = "test data absent: "

-- Why a case that needs test data cannot run: the folder, or the files of it this spec found missing.
function M.data_absent()
  local what = M.shared
  if M.exists(M.shared) and #M.missing > 0 then
    what = table.concat(M.missing, ", ") .. " in " .. M.shared
  end
  return M.DATA_SKIP .. what .. " (scripts/fetch-test-data.sh)"
end

function M.quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

function M.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

function M.write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

local tmp_count = 0
-- Names are unique across concurrent spec processes: os.tmpname() creates a file only this
-- process owns, and its name (plus a counter) is the stem (math.random is the same in every process).
local tmp_stem = nil
function M.tmpname(suffix)
  tmp_count = tmp_count + 1
  if not tmp_stem then
    tmp_stem = os.tmpname()
    os.remove(tmp_stem)
  end
  return ("%s-nibble-spec-%d%s"):format(tmp_stem, tmp_count, suffix or "")
end

function M.mkdtemp()
  local p = io.popen("mktemp -d \"${TMPDIR:-/tmp}/nibble-spec-XXXXXXXX\"")
  local d = p and p:read("*l")
  if p then p:close() end
  assert(d and d ~= "", "mktemp -d failed")
  return d
end

-- A fresh directory for one spec file, removed when its tests end (busted's teardown, from the calling
-- spec's environment): `local tmp = nbspec.private_dir()` at the spec file's top level.
function M.private_dir()
  local d = M.mkdtemp()
  local teardown = getfenv(2).teardown or teardown
  teardown(function() os.execute("rm -rf " .. M.quote(d)) end)
  return d
end

-- In sanitizer builds the busted process runs with the ASan runtime preloaded (it loads the
-- instrumented libnibble); children must not inherit it, except a luajit that loads libnibble.
local asan = os.getenv("NIBBLE_ASAN_PRELOAD")
function M.luajit_prefix()
  return asan and ("LD_PRELOAD=" .. M.quote(asan) .. " ") or ""
end

-- Run a shell command line; returns stdout, stderr, exit code (128+n for a signal).
function M.sh(cmdline, stdin)
  if asan then cmdline = "unset LD_PRELOAD; " .. cmdline end
  local out, err, rc, inp = M.tmpname(".out"), M.tmpname(".err"), M.tmpname(".rc"), nil
  local redirect = "</dev/null"
  if stdin then
    inp = M.tmpname(".in")
    M.write(inp, stdin)
    redirect = "<" .. M.quote(inp)
  end
  os.execute(("(%s) %s >%s 2>%s; echo $? >%s"):format(cmdline, redirect, M.quote(out), M.quote(err), M.quote(rc)))
  local o, e, c = M.read(out) or "", M.read(err) or "", tonumber((M.read(rc) or ""):match("%d+"))
  os.remove(out); os.remove(err); os.remove(rc)
  if inp then os.remove(inp) end
  return o, e, c
end

-- Run the nibble program with arguments (each quoted); returns stdout, stderr, exit code.
function M.nibble(args, stdin, env)
  local parts = {}
  for _, a in ipairs(args or {}) do parts[#parts + 1] = M.quote(a) end
  local prefix = ""
  for k, v in pairs(env or {}) do prefix = prefix .. k .. "=" .. M.quote(v) .. " " end
  return M.sh(prefix .. M.quote(M.bin) .. " " .. table.concat(parts, " "), stdin)
end

-- `if not nbspec.need(a, b) then return end` at the top of an `it`: when any argument is nil (a test
-- data path that `data` did not find), the case is skipped (busted's pending), saying which files.
function M.need(...)
  for i = 1, select("#", ...) do
    if not select(i, ...) then
      local pending = getfenv(2).pending or pending   -- busted's, from the calling spec
      pending(M.data_absent())
      return false
    end
  end
  return true
end

-- A case that runs in part without test data says so (the closing line of the spec counts it).
M.parts = 0
function M.skip_part(what)
  M.parts = M.parts + 1
  print("SKIP (test data, part: " .. what .. "): " .. M.data_absent())
end

-- The message of the error f(...) raises; fails the spec when it raises none.
function M.err_of(f, ...)
  local ok, e = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(e)
end

-- The relative amount by which two float32 forwards that sum in different orders (OpenBLAS kernel
-- sets, SIMD levels, torch) may disagree on an element of layer `layer`'s K or V (0-based) of a
-- Llama model `cfg` (its config.json table, or a loaded model's m.config) run on sequences of T tokens, and so on its calibrated
-- amax and k_scale / v_scale = amax / 448. Each float32 sum of n terms, in any order, lies within
-- n u of the sum of its |terms| (u = 2^-24); two such sums differ by up to twice that. A K/V element
-- of layer l is the end of a chain of sums: l whole layers, each of
--   RMSNorm (D squares) + q/k/v projection (D) + scores (hd, scaled) + softmax sum (T, exp 4u)
--   + P V (T) + o_proj (H hd) + residual + RMSNorm (D) + gate/up (D, SwiGLU 7u) + down (F) + residual
--   = 4D + H hd + hd + 2T + F + 14 roundings' worth,
-- then RMSNorm and the k/v projection (2D) + 6 roundings of the norm + 5 of RoPE. To first order in
-- u the relative errors of a chain add, when each step's result is as large as the sum of its |terms|
-- (no cancellation amplifying them: that holds for the amax element, the largest of its layer, and
-- is the one assumption here; without it no finite bound exists that does not depend on the weights).
-- stories260K, T = 128: 1.7e-5 for layer 0 to 3.8e-4 for layer 4 (measured across OpenBLAS's
-- Prescott..Cooperlake kernels and the scalar/AVX2/AVX-512 paths: <= 3.5e-7); a divisor of 447 for
-- 448 (2.2e-3) or the neighbouring layer's amax (>= 1.3 %) is outside it.
function M.kv_order_tol(cfg, layer, T)
  local D, H, F = cfg.hidden_size, cfg.num_attention_heads or cfg.n_heads, cfg.intermediate_size
  local hd = cfg.head_dim or D / H
  local per_layer = 4 * D + H * hd + hd + 2 * T + F + 14
  return 2 * 2 ^ -24 * (layer * per_layer + 2 * D + 11)
end

return M
