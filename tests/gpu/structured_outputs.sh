#!/usr/bin/env bash
# Structured outputs on the CUDA backend: `beluga serve --device cuda` with the demo model, greedy and
# sampled (n=2) requests under a JSON Schema, json_object and choice; each finished reply is checked
# by python3 (parses, required keys and types, enum, choice). A constrained greedy request must not
# take the plain device argmax path: its mask goes up with the step and the device sampler applies
# it (or, with --no-device-sampling in SERVE_FLAGS, the logits come to the host sampler).
#   BELUGA=build-cuda/beluga tests/gpu/structured_outputs.sh     (exit 0 = pass)
#   MODEL=models/beluga-demo-coder-mtp: the model directory when the binary is not in a build tree
set -uo pipefail
cd "$(dirname "$0")/../.."
BELUGA=${BELUGA:-build-cuda/beluga}
PORT=${PORT:-8771}
"$BELUGA" serve ${MODEL:-} --device cuda --port $PORT ${SERVE_FLAGS:-} > "${OUT:-/tmp}/serve_structured.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 120); do curl -sf localhost:$PORT/health > /dev/null && break; sleep 1; done
python3 - "$PORT" <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
def chat(extra):
    body = {"messages": [{"role": "user", "content": "Describe a person."}], "max_tokens": 160, **extra}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=300))
schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
          "age": {"type": "integer", "minimum": 0, "maximum": 120}, "role": {"enum": ["admin", "user"]}},
          "required": ["name", "age", "role"], "additionalProperties": False}
def valid(v):
    return (isinstance(v, dict) and set(v) == {"name", "age", "role"} and isinstance(v["name"], str)
            and len(v["name"]) <= 12 and isinstance(v["age"], int) and 0 <= v["age"] <= 120 and v["role"] in ("admin", "user"))
fails = finished = 0
rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
for extra in [{"temperature": 0, "response_format": rf}, {"temperature": 1, "seed": 3, "n": 2, "response_format": rf},
              {"temperature": 1, "seed": 4, "n": 2, "response_format": {"type": "json_object"}},
              {"temperature": 0, "structured_outputs": {"choice": ["red", "green", "blue"]}}]:
    r = chat(extra)
    for c in r["choices"]:
        text, fin = c["message"]["content"], c["finish_reason"]
        print(json.dumps({"request": list(extra)[-1], "finish": fin, "text": text}))
        if fin != "stop":
            continue
        finished += 1
        try:
            v = json.loads(text) if "structured_outputs" not in extra else text
        except Exception:
            v = None
        ok = (v in ("red", "green", "blue")) if "structured_outputs" in extra else \
             (isinstance(v, dict) if extra["response_format"]["type"] == "json_object" else valid(v))
        if not ok:
            fails += 1
            print("FAIL: reply does not fit its constraint")
u = chat({"temperature": 0})
print(json.dumps({"request": "unconstrained greedy", "text": u["choices"][0]["message"]["content"]}))
print(f"finished {finished}, failures {fails}")
sys.exit(1 if fails or finished < 3 else 0)
PY
rc=$?
kill $SERVER; wait $SERVER 2>/dev/null
echo "structured outputs on cuda: rc $rc"
exit $rc
