-- nibble.pipeline: the top of the pipeline layer: what `nibble run FILE` does with the declarative
-- recipe a file returned (the host calls execute): a recipe with a `distill` section is a QAD run
-- (nibble.qad), any other a PTQ run (nibble.ptq). The recipe layer below knows neither.
local recipe = require("nibble.recipe")
local util = require("nibble.util")

local P = {}

-- execute(r [, args]): the run of recipe r; returns its result. Only recipes are run: tables made by
-- nibble.recipe{...}, or with `extends` / `quantize`; a script that returns some other table keeps it
-- to itself (nil is returned). Run by the host (`nibble run`), a user error (a bad request) ends the
-- program with its message alone (nibble.util.program); called from Lua, errors are raised as usual.
local function execute(r, args)
  if type(r) ~= "table" then error("recipe: expected a recipe table, got " .. type(r), 0) end
  if not recipe.is_recipe(r) and r.extends == nil and r.quantize == nil then return nil end
  recipe.tag(r)
  if r.distill ~= nil then return require("nibble.qad").run(r, args) end
  return require("nibble.ptq").run(r, args)
end

function P.execute(r, args)
  return util.program(execute, r, args)
end

return P
