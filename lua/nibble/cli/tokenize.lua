-- nibble tokenize: encode text with a model's tokenizer and print the ids, the count or the tokens
-- Usage: nibble tokenize --model PATH [--text T | --file F] [--count] [--tokens] [--no-bos] [--special]
-- PATH is a tokenizer.json (or its directory), a .gguf or a tokenizer.model. Without --text or --file
-- the text is read from stdin. Prints the ids on one line; --count prints only their number;
-- --tokens prints one "id<TAB>spelling" line per token. --no-bos leaves out BOS/EOS (added as the
-- model's config says otherwise); --special turns text like <|im_end|> into that control token.
-- A --file with a NUL byte is refused (not text); a model's .safetensors file stands for its folder.
local cli = require("nibble.cli")   -- the option parser and how a command fails (cli.fail)
local nibble = require("nibble")

local USAGE = "usage: nibble tokenize --model PATH [--text T | --file F] [--count] [--tokens] [--no-bos] [--special]\n"
  .. "  PATH is a model folder, a tokenizer.json, a .gguf or a tokenizer.model\n"
  .. "  without --text or --file the text is read from stdin\n"
  .. "  --count: print only the number of tokens; --tokens: one \"id<TAB>spelling\" line per token\n"

local SPEC = {
  { "--model", "-m", key = "model", arg = "PATH", need = true }, { "--text", "-t", key = "text", arg = "TEXT" },
  { "--file", "-f", key = "file", arg = "FILE" }, { "--count", key = "count" }, { "--tokens", key = "tokens" },
  { "--no-bos", key = "bos", set = false }, { "--special", key = "special" },
}

return function(args)
  local o, code = cli.parse("tokenize", USAGE, args, SPEC)
  if not o then return code end
  local model, text, file, count, tokens, bos, special = o.model, o.text, o.file, o.count, o.tokens, o.bos, o.special
  if text and file then return cli.fail("tokenize", "give --text or --file, not both") end
  model = cli.model_dir(model)
  if file then
    local bad = cli.file_problem(file)
    if bad then return cli.fail("tokenize", bad) end
    local ok, t = pcall(nibble.data.read_text, file, "tokenize")   -- refuses a binary file, as eval's data
    if not ok then return cli.fail("tokenize", t) end
    text = t
  elseif not text then
    text = io.stdin:read("*a") or ""
  end
  local ok, tok = pcall(nibble.tokenizer.load, model)
  if not ok then return cli.fail("tokenize", tok) end
  local opts = { bos = bos ~= false, special = special or false }
  local ok2, t = pcall(tok.encode_tokens, tok, text, opts)
  if not ok2 then return cli.fail("tokenize", t) end
  local n = tonumber(t.n)
  if count then
    io.stdout:write(n, "\n")
  elseif tokens then
    local out = {}
    for k = 0, n - 1 do
      local id = t.ids[k]
      out[#out + 1] = ("%d\t%s"):format(id, tok:token(id))
    end
    io.stdout:write(table.concat(out, "\n"), n > 0 and "\n" or "")
  else
    local out = {}
    for k = 0, n - 1 do out[k + 1] = tostring(t.ids[k]) end
    io.stdout:write(table.concat(out, " "), "\n")
  end
  return 0
end
