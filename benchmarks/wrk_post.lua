-- wrk script of the overhead benchmark (benchmarks/overhead.py): POST one body repeatedly.
--
-- Environment:
--   WRK_BODY_FILE       path of the request body (required)
--   WRK_HEADERS         extra "Name: value" lines, one per line
--   WRK_MAX_PER_THREAD  stop a thread after this many responses (0 or unset: no cap)
--
-- At the end it prints one line, `WRK_JSON {...}`: counts, errors, and latency
-- percentiles in microseconds (from request write to the complete response).

local path = assert(os.getenv("WRK_BODY_FILE"), "WRK_BODY_FILE is not set")
local file = assert(io.open(path, "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/json"

for line in string.gmatch(os.getenv("WRK_HEADERS") or "", "[^\r\n]+") do
  local name, value = string.match(line, "^%s*([^:%s]+)%s*:%s*(.-)%s*$")
  if name then
    wrk.headers[name] = value
  end
end

-- The cap is a safety bound; a `response` callback costs wrk a little CPU per response,
-- so it is only defined when a cap is set.
local cap = tonumber(os.getenv("WRK_MAX_PER_THREAD") or "") or 0
if cap > 0 then
  local seen = 0
  response = function(status, headers, body)
    seen = seen + 1
    if seen >= cap then
      wrk.thread:stop()
    end
  end
end

done = function(summary, latency, requests)
  local errors = summary.errors
  local fields = {
    string.format('"requests":%d', summary.requests),
    string.format('"duration_us":%d', summary.duration),
    string.format('"bytes":%d', summary.bytes),
    string.format('"errors_connect":%d', errors.connect),
    string.format('"errors_read":%d', errors.read),
    string.format('"errors_write":%d', errors.write),
    string.format('"errors_status":%d', errors.status),
    string.format('"errors_timeout":%d', errors.timeout),
    string.format('"mean_us":%.1f', latency.mean),
    string.format('"max_us":%d', latency.max),
    string.format('"p50_us":%d', latency:percentile(50)),
    string.format('"p90_us":%d', latency:percentile(90)),
    string.format('"p99_us":%d', latency:percentile(99)),
  }
  io.write("WRK_JSON {" .. table.concat(fields, ",") .. "}\n")
end
