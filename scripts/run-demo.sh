#!/usr/bin/env bash
# `make run`: the mock engine as the default backend, then the gateway in the foreground on the embedded
# (SQLite) store. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-8080}; mock_port=${2:-8001}; data=${3:-var/data}
config=deploy/examples/demo.toml
if [ "$mock_port" != 8001 ]; then
    mkdir -p "$data"
    sed "s#127.0.0.1:8001#127.0.0.1:${mock_port}#" "$config" > "$data/demo.toml"
    config="$data/demo.toml"
fi
.venv/bin/python -m gateway mock-engine --port "$mock_port" --model mock-model &
mock=$!
trap 'kill "$mock" 2>/dev/null; wait "$mock" 2>/dev/null || true' EXIT
echo "gateway on http://127.0.0.1:${port} (mock engine on :${mock_port}); try:"
echo "  curl http://127.0.0.1:${port}/v1/chat/completions -H 'Authorization: Bearer sk-gw-demo-0000000000000000' \\"
echo "       -H 'Content-Type: application/json' -d '{\"model\":\"demo\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'"
.venv/bin/python -m gateway serve --config "$config" --data-dir "$data" --port "$port"
