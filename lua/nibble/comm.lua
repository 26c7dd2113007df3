-- nibble.comm: the ranks of a run launched by mpirun, on the default context's communicator
-- (nibble/comm.h). rank() and size() say where this process stands; agree(fn) runs a step that can
-- fail on one rank only (a bad file, a recipe error, a NaN) and makes every rank fail with the same
-- one-line message naming the first rank that failed, so no rank is left waiting in a collective;
-- together(fn) runs a whole command whose steps meet at such points.
-- With one rank all of them are plain calls and messages are unchanged.
local ffi = require("ffi")
local nibble = require("nibble")
local C, check = nibble.C, nibble.check

local M = {}

local MSG = 1024   -- bytes of a message carried between ranks (longer ones are cut)

local function ctx() return nibble.context() end

function M.rank() return tonumber(C.nb_comm_rank(ctx())) end
function M.size() return tonumber(C.nb_comm_size(ctx())) end
function M.backend() return ffi.string(C.nb_comm_backend(ctx())) end

-- one record per rank: a failed flag byte, then the message
local function record(ok, err)
  local buf = ffi.new("char[?]", MSG)
  if not ok then
    local s = tostring(err):sub(1, MSG - 2)
    buf[0] = 1
    ffi.copy(buf + 1, s, #s)
  end
  return buf
end

-- agree(fn, ...): fn's results when it succeeded on every rank; else the error of the lowest failed
-- rank, "rank R: message", raised on all of them.
function M.agree(fn, ...)
  local res = { pcall(fn, ...) }
  local n = M.size()
  if n == 1 then
    if not res[1] then error(res[2], 0) end
    return unpack(res, 2, table.maxn(res))
  end
  local all = ffi.new("char[?]", MSG * n)
  check(C.nb_comm_allgather(ctx(), record(res[1], res[2]), all, MSG))
  for r = 0, n - 1 do
    if all[r * MSG] ~= 0 then error(("rank %d: %s"):format(r, ffi.string(all + r * MSG + 1)), 0) end
  end
  return unpack(res, 2, table.maxn(res))
end

-- together(fn, ...): fn(sync, ...) on every rank, where sync() is a point all ranks reach in the same
-- order between fn's collectives. A rank that fails joins the others at their next sync with its
-- message, and every rank then raises "rank R: message" (R the lowest failed rank): no rank is left
-- waiting. fn must make sure that a rank which fails between two syncs still takes part in the
-- collectives the others run there (ptq.calibrate ends its observers' merge even after an error).
function M.together(fn, ...)
  if M.size() == 1 then return fn(function() end, ...) end
  local settled = false
  local function sync()
    local ok, err = pcall(M.agree, function() end)
    if not ok then
      settled = true
      error(err, 0)
    end
  end
  local res = { pcall(fn, sync, ...) }
  if res[1] then return unpack(res, 2, table.maxn(res)) end
  if not settled then M.agree(error, res[2], 0) end   -- raises the agreed message
  error(res[2], 0)
end

-- same_i64(what, v): v when every rank holds the same value, else an error naming the first rank that
-- differs from rank 0 (a value every rank must derive identically, e.g. a seeded calibration offset).
function M.same_i64(what, v)
  local n = M.size()
  if n == 1 then return v end
  local all = ffi.new("int64_t[?]", n)
  local mine = ffi.new("int64_t[1]", v)
  check(C.nb_comm_allgather(ctx(), mine, all, 8))
  for r = 1, n - 1 do
    if all[r] ~= all[0] then
      error(("%s differs between ranks: %d on rank 0, %d on rank %d"):format(what, tonumber(all[0]),
            tonumber(all[r]), r), 0)
    end
  end
  return v
end

return M
