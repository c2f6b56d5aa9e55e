#!/usr/bin/env bash
# test_ollama_errors.sh — the Ollama API's refusals over plain HTTP, as a
# script or a tool without a client library meets them: every answer under
# /api/ that refuses is {"error": "..."} with its status — bad JSON, a body
# that is not an object, an unknown option and an unsupported one named as
# "options.NAME", fields hearth cannot honour by name, a model not served,
# an unknown route and a wrong method — and nothing was generated for them.
#   test_ollama_errors.sh FAKE_SERVER
set -euo pipefail
server=${1:?usage: test_ollama_errors.sh FAKE_SERVER}
log=$(mktemp)
"$server" --port 0 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"' EXIT
url=
for _ in $(seq 100); do
  url=$(grep -o 'http://[^ ]*' "$log" | head -n 1 || true)
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { echo "the server did not start:"; cat "$log"; exit 1; }

fails=0
# expect METHOD ROUTE BODY STATUS PATTERN: the status, an {"error"} body alone, the message matching PATTERN
expect() {
  local method=$1 route=$2 body=$3 status=$4 pattern=$5 out code
  out=$(curl -s -X "$method" -H 'Content-Type: application/json' -w '\n%{http_code}' --data-binary "$body" "$url$route")
  code=${out##*$'\n'}
  out=${out%$'\n'*}
  if [ "$code" != "$status" ]; then
    echo "FAIL $method $route $body: status $code, want $status ($out)"; fails=$((fails + 1)); return
  fi
  if ! printf '%s' "$out" | grep -Eq '^\{"error":"[^"]*'; then
    echo "FAIL $method $route $body: not an Ollama error object: $out"; fails=$((fails + 1)); return
  fi
  if ! printf '%s' "$out" | grep -Eq -- "$pattern"; then
    echo "FAIL $method $route $body: '$out' does not match '$pattern'"; fails=$((fails + 1)); return
  fi
  echo "ok   $method $route -> $code $out"
}

expect POST /api/generate '{"model":"fake-model","prompt":"x"' 400 'not valid JSON'
expect POST /api/chat '{"model":"fake-model","messages":[{"role":"user","content":"x"}' 400 'not valid JSON'
expect POST /api/chat '[1,2,3]' 400 'must be a JSON object'
expect POST /api/generate '{"prompt":"x"}' 400 'model is required'
expect POST /api/generate '{"model":"fake-model","prompt":"x","options":{"frobnicate":1}}' 400 'options\.frobnicate is not an Ollama option'
expect POST /api/generate '{"model":"fake-model","prompt":"x","options":{"mirostat":2}}' 400 'options\.mirostat is not supported'
expect POST /api/chat '{"model":"fake-model","messages":[{"role":"user","content":"x"}],"options":{"tfs_z":0.5}}' 400 'options\.tfs_z'
expect POST /api/chat '{"model":"fake-model","messages":[{"role":"user","content":"x"}],"options":{"top_p":7}}' 400 'options\.top_p must be between'
expect POST /api/generate '{"model":"fake-model","prompt":"x","template":"{{ .Prompt }}"}' 400 '^\{"error":"template is not supported'
expect POST /api/generate '{"model":"fake-model","prompt":"x","context":[1,2]}' 400 '^\{"error":"context is not supported'
expect POST /api/generate '{"model":"fake-model","prompt":"x","format":"xml"}' 400 'format must be'
expect POST /api/chat '{"model":"fake-model","messages":[{"role":"user","content":"x"}],"keep_alive":"later"}' 400 'keep_alive must be a duration'
expect POST /api/generate '{"model":"no-such-model","prompt":"x"}' 404 "model 'no-such-model' not found"
expect POST /api/chat '{"model":"no-such-model","messages":[{"role":"user","content":"x"}]}' 404 "model 'no-such-model' not found"
expect POST /api/show '{"model":"no-such-model"}' 404 "model 'no-such-model' not found"
expect POST /api/embed '{"model":"no-such-model","input":"x"}' 404 "not found"
expect DELETE /api/delete '{"model":"no-such-model"}' 404 'neither a registry name'
expect POST /api/pull '{"model":"org/x","insecure":true}' 400 'insecure is not supported'
expect POST /api/create '{"model":"x","from":"y"}' 400 '/api/create is not supported: hearth makes no models'
expect POST /api/copy '{"source":"a","destination":"b"}' 400 '/api/copy is not supported'
expect POST /api/push '{"model":"x"}' 400 '/api/push is not supported'
expect POST /api/blobs/sha256:abc '' 400 'not supported: hearth takes no Modelfile blobs'
expect POST /api/unknown '{}' 404 'Unknown route'
expect GET /api/chat '' 405 'not allowed'

# none of them reached the engine
kill "$pid"
wait "$pid" || true
trap 'rm -f "$log"' EXIT
if ! grep -q 'stopped (0 generations' "$log"; then
  echo "FAIL: a refused request generated: $(grep 'stopped' "$log")"; fails=$((fails + 1))
fi
[ "$fails" -eq 0 ] && echo "all refusals as expected" || { echo "$fails failed"; exit 1; }
