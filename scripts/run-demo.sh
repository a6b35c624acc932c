#!/usr/bin/env bash
# `make run`: the mock engine as the default backend, then the gateway in the foreground on the embedded
# (SQLite) store, with the admin port (the web UI and the admin API) on. Ctrl-C stops both.
#
# The demo's admin key is made once per data directory, at random, and kept there (DATA/demo-admin.secret,
# readable by its owner only); the config the gateway serves (DATA/demo.toml) is deploy/examples/demo.toml
# with the ports filled in and that key added to the demo-admin principal.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-8080}; mock_port=${2:-8001}; data=${3:-var/data}; admin_port=${4:-8081}
py=.venv/bin/python
mkdir -p "$data"
secret_file="$data/demo-admin.secret"
if [ ! -s "$secret_file" ]; then
    (umask 077; "$py" -c 'from gateway.keys import generate_secret; print(generate_secret())' > "$secret_file")
fi
admin_key=$(cat "$secret_file")
config="$data/demo.toml"
(
    umask 077
    {
        sed "s#127.0.0.1:8001#127.0.0.1:${mock_port}#" deploy/examples/demo.toml
        printf '\n# Added by scripts/run-demo.sh: the demo admin key (also in %s).\n' "$secret_file"
        printf '[[keys]]\nprincipal = "demo-admin"\nname = "demo-admin-key"\nsecret = "%s"\n' "$admin_key"
    } > "$config"
)
chmod 600 "$config"  # it holds a secret; an older copy may have been readable
"$py" -m gateway mock-engine --port "$mock_port" --model mock-model &
mock=$!
trap 'kill "$mock" 2>/dev/null; wait "$mock" 2>/dev/null || true' EXIT
cat <<TEXT
gateway on http://127.0.0.1:${port} (mock engine on :${mock_port}); try:
  curl http://127.0.0.1:${port}/v1/chat/completions -H 'Authorization: Bearer sk-gw-demo-0000000000000000' \\
       -H 'Content-Type: application/json' -d '{"model":"demo","messages":[{"role":"user","content":"Hello"}]}'
web UI on http://127.0.0.1:${admin_port}/ui/ : sign in with the demo admin key
  ${admin_key}
  (kept in ${secret_file}; the admin API takes it as a Bearer token on the same port)
TEXT
"$py" -m gateway serve --config "$config" --data-dir "$data" --port "$port" --admin-port "$admin_port"
