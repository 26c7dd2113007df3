-- nibble.json: encoding (stable key order, escapes, invalid UTF-8, non-finite numbers, indentation)
-- and decoding (escapes, surrogate pairs, null, errors with line and column), and round trips.
local json = require("nibble.json")

describe("json.encode", function()
  it("encodes scalars, arrays and objects with sorted keys", function()
    assert.are.equal('{"a":[1,2.5,true,null],"b":"x","c":{}}',
                     json.encode({ b = "x", a = { 1, 2.5, true, json.null }, c = json.object() }))
    assert.are.equal("[]", json.encode({}))
    assert.are.equal("null", json.encode(0 / 0))
    assert.are.equal("null", json.encode(math.huge))
    assert.are.equal("9007199254740991", json.encode(2 ^ 53 - 1))
    assert.are.equal("0.10000000000000001", json.encode(0.1))
    assert.are.equal("-3", json.encode(-3))
  end)

  it("escapes strings into valid JSON", function()
    assert.are.equal('"a\\"b\\\\c\\n\\t\\u0001\\u007f"', json.encode('a"b\\c\n\t\1\127'))
    assert.are.equal('"\226\150\129x"', json.encode("\226\150\129x"))   -- U+2581 passes through
    assert.are.equal('"\\u00ff\\u00c3("', json.encode("\255\195("))       -- not UTF-8: escaped bytes
    assert.are.equal('"\\u00ed\\u00a0\\u0080"', json.encode("\237\160\128")) -- a UTF-16 surrogate
  end)

  it("indents, keeping numeric lists on one line", function()
    assert.are.equal('{\n  "n": "x",\n  "shape": [64, 64],\n  "t": [\n    {\n      "a": 1\n    }\n  ]\n}',
                     json.encode({ n = "x", shape = { 64, 64 }, t = { { a = 1 } } }, { indent = "  " }))
  end)

  it("refuses what JSON cannot say", function()
    local t = {}
    t.self = t
    assert.has_error(function() json.encode(t) end, "json.encode: cycle in table")
    assert.has_error(function() json.encode(print) end, "json.encode: cannot encode a function")
  end)
end)

describe("json.decode", function()
  it("decodes values, escapes and surrogate pairs", function()
    local v = json.decode(' {"a": [1, -2.5e3, true, false, null], "s": "\\u00e9\\ud83d\\ude00\\n\\/", "o": {}} ')
    assert.are.same({ 1, -2500, true, false, json.null }, v.a)
    assert.are.equal("\195\169\240\159\152\128\n/", v.s)
    assert.are.same({}, v.o)
  end)

  it("round-trips", function()
    local value = { name = "model.layers.0", shape = { 172, 64 }, meta = { { key = "k", value = "v\1" } }, f = 1e-5 }
    assert.are.same(value, json.decode(json.encode(value)))
    assert.are.same(value, json.decode(json.encode(value, { indent = "\t" })))
  end)

  it("names the position of bad input", function()
    assert.has_error(function() json.decode('{"a": 1,\n "b" 2}') end, "json.decode: expected ':' at line 2 column 6")
    assert.has_error(function() json.decode("[1, 2") end, "json.decode: expected ',' or ']' at line 1 column 6")
    assert.has_error(function() json.decode('"abc') end, "json.decode: unterminated string at line 1 column 1")
    assert.has_error(function() json.decode("[1] x") end, "json.decode: trailing characters at line 1 column 5")
    assert.has_error(function() json.decode("nul") end, "json.decode: unexpected character at line 1 column 1")
  end)
end)
