-- nibble.comm on one rank (the self backend, as every spec runs): rank 0 of 1, and agree, together and
-- same_i64 are plain calls whose results and messages pass through unchanged. The many-rank behaviour
-- runs under mpirun in ctest mpi.* (tests/c/test_comm.c, tests/scripts/ptq_ranks.sh).
local comm = require("nibble.comm")

describe("nibble.comm on one rank", function()
  it("is rank 0 of 1 on the self backend", function()
    assert.are.equal(0, comm.rank())
    assert.are.equal(1, comm.size())
    assert.are.equal("self", comm.backend())
  end)

  it("passes results and errors through agree and together unchanged", function()
    local a, b, c = comm.agree(function(x) return x, nil, x + 1 end, 4)
    assert.are.same({ 4, nil, 5 }, { a, b, c })
    local ok, err = pcall(comm.agree, function() error("calibration: no rows", 0) end)
    assert.is_false(ok)
    assert.are.equal("calibration: no rows", err)
    local syncs = 0
    assert.are.equal(7, comm.together(function(sync, v) sync(); syncs = syncs + 1; sync(); return v end, 7))
    assert.are.equal(1, syncs)
    ok, err = pcall(comm.together, function(sync) sync(); error("export: the folder is not empty", 0) end)
    assert.is_false(ok)
    assert.are.equal("export: the folder is not empty", err)
    assert.are.equal(12345, comm.same_i64("an offset", 12345))
  end)
end)
