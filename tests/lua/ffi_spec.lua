-- The FFI declarations generated at build time (cmake/nibble_cdef.lua): they cover every header
-- that nibble.h includes, every declared function exists in libnibble, and the generator keeps
-- only our headers' declarations, strips what LuaJIT cannot take and fails naming the header.
local nibble = require("nibble")
local nbspec = require("nbspec")
local def = require("nibble.cdef")

local src = nbspec.source_dir
local cc = os.getenv("NIBBLE_CC") or "cc"

describe("generated cdef", function()
  it("covers every header nibble.h includes", function()
    local text = assert(nbspec.read(src .. "/core/include/nibble/nibble.h"))
    local have = {}
    for _, h in ipairs(def.headers) do have[h] = true end
    local n = 0
    for h in text:gmatch('#include%s+"nibble/([%w_]+%.h)"') do
      n = n + 1
      assert.is_true(have[h] == true, "missing from the cdef: " .. h)
      assert.truthy(def.cdef:find("/* nibble/" .. h .. " */", 1, true), h)
    end
    assert.is_true(n >= 7)
  end)

  it("declares only functions that libnibble defines", function()
    local missing, count = {}, 0
    for name, after in def.cdef:gmatch("%f[%w_](nb_[%w_]+)%s*%((.)") do
      if after ~= "*" then   -- not `nb_status (*fn)(...)`, a function pointer type
        count = count + 1
        if not pcall(function() return nibble.C[name] end) then missing[#missing + 1] = name end
      end
    end
    assert.is_true(count > 50, tostring(count))
    assert.are.same({}, missing)
  end)

  it("has the enums and struct layouts of the headers", function()
    local ffi = require("ffi")
    assert.are.equal(-4, nibble.C.NB_ERR_FORMAT)
    assert.are.equal(17, nibble.C.NB_DTYPE_COUNT)
    assert.are.equal(8 + 8 * 8 * 2 + 8 + 8 + 4 + 4, ffi.sizeof("nb_tensor"))
    assert.are.equal(ffi.offsetof("nb_tensor", "buf"), 8 + 128 + 8)
  end)
end)

describe("the generator", function()
  local dir
  local function generate(header_text)
    dir = nbspec.mkdtemp()
    os.execute("mkdir -p " .. nbspec.quote(dir .. "/inc/nibble"))
    nbspec.write(dir .. "/inc/nibble/x.h", header_text)
    nbspec.write(dir .. "/inc/nibble/nibble.h", '#include <stdio.h>\n#include "nibble/x.h"\n')
    local i = dir .. "/x.i"
    local _, err, code = nbspec.sh(("%s -E -dD -DNB_FFI_CDEF -I%s %s -o %s"):format(cc, nbspec.quote(dir .. "/inc"),
      nbspec.quote(dir .. "/inc/nibble/nibble.h"), nbspec.quote(i)))
    assert.are.equal(0, code, err)
    local out = dir .. "/cdef.lua"
    local _, gerr, gcode = nbspec.sh(("luajit %s %s %s %s"):format(nbspec.quote(src .. "/cmake/nibble_cdef.lua"),
      nbspec.quote(i), nbspec.quote(dir .. "/inc/nibble"), nbspec.quote(out)))
    return gcode, gerr, gcode == 0 and dofile(out) or nil
  end
  after_each(function() if dir then os.execute("rm -rf " .. nbspec.quote(dir)) end end)

  it("keeps our declarations and defines, strips what cdef cannot take", function()
    local code, err, g = generate([[
#include <stdint.h>
#define NB_X_MAGIC 0x46554747u
#define NB_X_NAME "hello"
#define NB_X_F 1.5
#define NB_X_FN(a) ((a) + 1)
typedef struct nb_x { int a; struct { int b; } inner; } nb_x;
static inline int nb_x_add(int a, int b) { if (a) { return a + b; } return b; }
int nb_x_f(const char *__restrict p) __attribute__((nonnull(1)));
__attribute__((visibility("default"))) void nb_x_g(void);
_Static_assert(sizeof(int) == 4, "int");
typedef void (*nb_x_cb)(void *);
FILE *nb_x_file(void);
enum { NB_X_N = NB_X_FN(7) };
]])
    assert.are.equal(0, code, err)
    assert.are.same({ NB_X_MAGIC = 0x46554747, NB_X_NAME = "hello", NB_X_F = 1.5 }, g.defines)
    assert.are.same({ "typedef struct _IO_FILE FILE;" }, g.prelude)
    assert.truthy(g.headers[1] == "nibble.h" or g.headers[1] == "x.h")
    assert.falsy(g.cdef:find("nb_x_add", 1, true))
    assert.falsy(g.cdef:find("__attribute__", 1, true))
    assert.falsy(g.cdef:find("__restrict", 1, true))
    assert.falsy(g.cdef:find("_Static_assert", 1, true))
    assert.falsy(g.cdef:find("printf", 1, true))         -- <stdio.h> is not ours
    assert.truthy(g.cdef:find("NB_X_N = ((7) + 1)", 1, true))
    assert.truthy(g.cdef:find("int nb_x_f(const char * p) ;", 1, true), g.cdef)
    -- it loads in a fresh LuaJIT
    local probe = dir .. "/probe.lua"
    nbspec.write(probe, ([[
local ffi = require("ffi")
local g = dofile(%q)
for _, p in ipairs(g.prelude) do ffi.cdef(p) end
ffi.cdef(g.cdef)
print(ffi.sizeof("nb_x"), ffi.C.NB_X_N)
]]):format(dir .. "/cdef.lua"))
    local out, perr, pcode = nbspec.sh("luajit " .. nbspec.quote(probe))
    assert.are.equal(0, pcode, perr)
    assert.are.equal("8\t8\n", out)
  end)

  it("fails the build naming the header LuaJIT rejects", function()
    local code, err = generate("typedef unsigned __int128 nb_u128;\nint nb_ok(void);\n")
    assert.are.equal(1, code)
    assert.truthy(err:find("nibble_cdef: LuaJIT cannot parse the declarations of nibble/x.h: ", 1, true), err)
    assert.truthy(err:find("typedef unsigned __int128 nb_u128;", 1, true), err)
  end)
end)
