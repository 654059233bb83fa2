#!/usr/bin/env bash
# TGI's and OpenAI's routes of tgi-llm's front with curl. Start the server first:
#   bash scripts/serve.sh --port 3000          (add --api-key KEY to require a key)
# then: bash clients/curl_examples.sh [http://localhost:3000]
set -euo pipefail
URL=${1:-http://localhost:3000}
AUTH=()
[ -n "${TGI_API_KEY:-}" ] && AUTH=(-H "Authorization: Bearer $TGI_API_KEY")
JSON=(-H 'Content-Type: application/json')

echo "== /info";  curl -s "${AUTH[@]}" "$URL/info"; echo
echo "== /health"; curl -s -o /dev/null -w '%{http_code}\n' "$URL/health"

echo "== /generate (details)"
curl -s "${AUTH[@]}" "${JSON[@]}" "$URL/generate" \
  -d '{"inputs": "What is Deep Learning?", "parameters": {"max_new_tokens": 20, "details": true}}'; echo

echo "== /generate_stream (server-sent events)"
curl -sN "${AUTH[@]}" "${JSON[@]}" "$URL/generate_stream" \
  -d '{"inputs": "What is Deep Learning?", "parameters": {"max_new_tokens": 10}}'

echo "== /v1/chat/completions"
curl -s "${AUTH[@]}" "${JSON[@]}" "$URL/v1/chat/completions" \
  -d '{"model": "tgi", "messages": [{"role": "user", "content": "What is the capital of France?"}],
       "max_tokens": 32, "temperature": 0}'; echo

echo "== /v1/chat/completions (stream)"
curl -sN "${AUTH[@]}" "${JSON[@]}" "$URL/v1/chat/completions" \
  -d '{"model": "tgi", "messages": [{"role": "user", "content": "Count to five."}],
       "max_tokens": 24, "stream": true, "stream_options": {"include_usage": true}}'

echo "== /v1/completions"
curl -s "${AUTH[@]}" "${JSON[@]}" "$URL/v1/completions" \
  -d '{"model": "tgi", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}'; echo

echo "== /tokenize"
curl -s "${AUTH[@]}" "${JSON[@]}" "$URL/tokenize" -d '{"inputs": "Hello world"}'; echo

echo "== a validation error: 422 with TGI's message"
curl -s -w ' (%{http_code})\n' "${AUTH[@]}" "${JSON[@]}" "$URL/generate" \
  -d '{"inputs": "hi", "parameters": {"temperature": -1}}'

echo "== /metrics (first lines)"
curl -s "$URL/metrics" | grep '^tgi_' | head -5 || true
