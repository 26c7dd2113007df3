-- nibble plot: draw the curves of a QAD metrics JSONL file (loss, KL, CE, lr, grad norm, tokens/s, evals) as SVG
-- Usage: nibble plot METRICS.jsonl [MORE.jsonl ...] --out FILE.svg [--keys loss,kd,...] [--log] [--title T]
-- One panel per key, step on the x axis; several files are drawn over each other (one color each,
-- named in the legend). Lines that are not JSON objects with a numeric "step" are skipped. Keys
-- default to those present among loss, kd, ce, lr, grad_norm, tokens_per_s, eval_kld, eval_ppl,
-- eval_top1. --log uses a log10 y axis for panels whose values are all positive. Plain SVG 1.1.
local cli = require("nibble.cli")   -- the option parser and how a command fails (cli.fail)
local nibble = require("nibble")

local USAGE = "usage: nibble plot METRICS.jsonl [MORE.jsonl ...] --out FILE.svg [--keys k1,k2,...] [--log] [--title T]\n"
local DEFAULT_KEYS = { "loss", "kd", "ce", "lr", "grad_norm", "tokens_per_s", "eval_kld", "eval_ppl", "eval_top1" }
local COLORS = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f" }

local function esc(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;" }))
end

-- read(path): { [key] = { {step, value}, ... } } in file order, and the number of records.
local function read(path)
  local bad = cli.file_problem(path)
  if bad then return nil, bad end
  local f, e = io.open(path, "rb")
  if not f then return nil, tostring(e) end
  local series, n = {}, 0
  for line in f:lines() do
    local ok, obj = pcall(nibble.json.decode, line)
    if ok and type(obj) == "table" and type(obj.step) == "number" then
      n = n + 1
      for k, v in pairs(obj) do
        if k ~= "step" and type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge then
          local s = series[k]
          if not s then s = {}; series[k] = s end
          s[#s + 1] = { obj.step, v }
        end
      end
    end
  end
  f:close()
  return series, n
end

-- "nice" tick values covering [lo, hi] (about n of them).
local function ticks(lo, hi, n)
  if hi <= lo then hi = lo + (lo ~= 0 and math.abs(lo) * 0.1 or 1) end
  local raw = (hi - lo) / n
  local mag = 10 ^ math.floor(math.log10(raw))
  local step = mag
  for _, m in ipairs({ 1, 2, 2.5, 5, 10 }) do
    if raw <= m * mag then step = m * mag; break end
  end
  local first = math.floor(lo / step) * step
  local out = {}
  for v = first, hi + step * 0.5, step do
    if v >= lo - step * 1e-9 and v <= hi + step * 1e-9 then out[#out + 1] = v end
  end
  return out, step
end

local function fmt(v, step)
  if v == 0 then return "0" end
  local a = math.abs(v)
  if a >= 1e5 or a < 1e-3 then return ("%.2g"):format(v) end
  local dec = -math.floor(math.log10(step) + 1e-9)
  dec = dec > 0 and math.min(dec, 6) or 0
  return ("%." .. ("%d"):format(dec) .. "f"):format(v)
end

local function panel(out, x0, y0, w, h, key, files, uselog)
  local L, R, T, B = 58, 12, 24, 30
  local pw, ph = w - L - R, h - T - B
  local xmin, xmax, ymin, ymax = math.huge, -math.huge, math.huge, -math.huge
  local positive = true
  for _, fdata in ipairs(files) do
    for _, p in ipairs(fdata.series[key] or {}) do
      xmin, xmax = math.min(xmin, p[1]), math.max(xmax, p[1])
      ymin, ymax = math.min(ymin, p[2]), math.max(ymax, p[2])
      if p[2] <= 0 then positive = false end
    end
  end
  local logy = uselog and positive
  local function ty(v) return logy and math.log10(v) or v end
  local lo, hi = ty(ymin), ty(ymax)
  if hi - lo < 1e-12 then lo, hi = lo - 0.5 * math.max(math.abs(lo), 1e-3), hi + 0.5 * math.max(math.abs(hi), 1e-3) end
  local pad = (hi - lo) * 0.05
  lo, hi = lo - pad, hi + pad
  if xmax <= xmin then xmin, xmax = xmin - 1, xmax + 1 end
  local function sx(x) return x0 + L + (x - xmin) / (xmax - xmin) * pw end
  local function sy(y) return y0 + T + ph - (ty(y) - lo) / (hi - lo) * ph end
  local function syr(v) return y0 + T + ph - (v - lo) / (hi - lo) * ph end
  out[#out + 1] = ('<g><rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#ffffff" stroke="#cccccc"/>'):format(
    x0 + L, y0 + T, pw, ph)
  out[#out + 1] = ('<text x="%.1f" y="%.1f" font-size="13" font-weight="bold">%s%s</text>'):format(x0 + L, y0 + 16,
    esc(key), logy and " (log)" or "")
  local yt, ystep = ticks(lo, hi, 5)
  if logy then
    -- 1-2-5 values inside the range read better than evenly spaced exponents
    local nice = {}
    for k = math.floor(lo) - 1, math.ceil(hi) do
      for _, m in ipairs({ 1, 2, 5 }) do
        local v = math.log10(m) + k
        if v >= lo and v <= hi then nice[#nice + 1] = v end
      end
    end
    if #nice > 8 then
      local every = {}
      for _, v in ipairs(nice) do if math.abs(v - math.floor(v + 0.5)) < 1e-9 then every[#every + 1] = v end end
      nice = every
    end
    if #nice >= 2 then yt = nice end
  end
  for _, v in ipairs(yt) do
    local y = syr(v)
    out[#out + 1] = ('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eeeeee"/>'):format(x0 + L, y, x0 + L + pw, y)
    local label = logy and fmt(10 ^ v, 10 ^ v / 10) or fmt(v, ystep)
    out[#out + 1] = ('<text x="%.1f" y="%.1f" font-size="10" text-anchor="end">%s</text>'):format(x0 + L - 4, y + 3,
      esc(label))
  end
  local xt, xstep = ticks(xmin, xmax, 5)
  for _, v in ipairs(xt) do
    local x = sx(v)
    out[#out + 1] = ('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eeeeee"/>'):format(x, y0 + T, x, y0 + T + ph)
    out[#out + 1] = ('<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">%s</text>'):format(x,
      y0 + T + ph + 13, esc(fmt(v, xstep)))
  end
  out[#out + 1] = ('<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle" fill="#555555">step</text>'):format(
    x0 + L + pw / 2, y0 + h - 4)
  for i, fdata in ipairs(files) do
    local pts = fdata.series[key]
    if pts and #pts > 0 then
      local color = COLORS[(i - 1) % #COLORS + 1]
      if #pts == 1 then
        out[#out + 1] = ('<circle cx="%.2f" cy="%.2f" r="2.5" fill="%s"/>'):format(sx(pts[1][1]), sy(pts[1][2]), color)
      else
        local coords = {}
        for _, p in ipairs(pts) do coords[#coords + 1] = ("%.2f,%.2f"):format(sx(p[1]), sy(p[2])) end
        out[#out + 1] = ('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>'):format(color,
          table.concat(coords, " "))
        if #pts <= 40 then
          for _, p in ipairs(pts) do
            out[#out + 1] = ('<circle cx="%.2f" cy="%.2f" r="2" fill="%s"/>'):format(sx(p[1]), sy(p[2]), color)
          end
        end
      end
    end
  end
  out[#out + 1] = "</g>"
end

local SPEC = {
  { "--out", "-o", key = "out", arg = "FILE.svg", need = true }, { "--keys", key = "keys", list = "metric names" },
  { "--log", key = "log" }, { "--title", key = "title", arg = "TEXT" }, positional = "METRICS.jsonl", need_positional = true,
}

return function(args)
  local o, code = cli.parse("plot", USAGE, args, SPEC)
  if not o then return code end
  local files, keys, out_path, uselog, title = o, o.keys, o.out, o.log or false, o.title
  local data = {}
  for _, p in ipairs(files) do
    local series, n = read(p)
    if not series then return cli.fail("plot", n) end
    if n == 0 then return cli.fail("plot", p .. " has no metrics records (JSON objects with a numeric \"step\")") end
    data[#data + 1] = { path = p, series = series }
  end
  if not keys then
    keys = {}
    for _, k in ipairs(DEFAULT_KEYS) do
      for _, d in ipairs(data) do
        if d.series[k] then keys[#keys + 1] = k; break end
      end
    end
  else
    for _, k in ipairs(keys) do
      local found = false
      for _, d in ipairs(data) do found = found or d.series[k] ~= nil end
      if not found then return cli.fail("plot", ("no file has the key '%s'"):format(k)) end
    end
  end
  if #keys == 0 then return cli.fail("plot", "none of the default keys is present; choose with --keys") end
  local cols = math.min(3, #keys)
  local rows = math.ceil(#keys / cols)
  local pw, ph = 340, 220
  local head = 30 + (#data > 1 and 16 * #data or 0)
  local W, H = cols * pw + 20, rows * ph + head + 10
  local out = {
    '<?xml version="1.0" encoding="UTF-8"?>',
    ('<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="%d" height="%d" viewBox="0 0 %d %d" '
      .. 'font-family="Helvetica, Arial, sans-serif">'):format(W, H, W, H),
    ('<rect x="0" y="0" width="%d" height="%d" fill="#fafafa"/>'):format(W, H),
    ('<text x="10" y="20" font-size="15" font-weight="bold">%s</text>'):format(esc(title or ("QAD metrics: " .. files[1]))),
  }
  if #data > 1 then
    for k, d in ipairs(data) do
      local y = 30 + 16 * (k - 1)
      out[#out + 1] = ('<rect x="12" y="%d" width="18" height="4" fill="%s"/>'):format(y + 4, COLORS[(k - 1) % #COLORS + 1])
      out[#out + 1] = ('<text x="36" y="%d" font-size="11">%s</text>'):format(y + 10, esc(d.path))
    end
  end
  for k, key in ipairs(keys) do
    local c, r = (k - 1) % cols, math.floor((k - 1) / cols)
    panel(out, 10 + c * pw, head + r * ph, pw, ph, key, data, uselog)
  end
  out[#out + 1] = "</svg>"
  local f, e = io.open(out_path, "wb")
  if not f then
    e = tostring(e)
    if e:sub(1, #out_path + 2) == out_path .. ": " then e = e:sub(#out_path + 3) end   -- the path once
    return cli.fail("plot", ("cannot write %s: %s"):format(out_path, e))
  end
  f:write(table.concat(out, "\n"), "\n")
  f:close()
  io.stdout:write(("wrote %s (%d panels, %d file%s)\n"):format(out_path, #keys, #data, #data > 1 and "s" or ""))
  return 0
end
