#!/usr/bin/env bash
# Installs the peer gateways that `perf.bench` measures beside ours, OUTSIDE the project's dependencies:
#   perf/.peers/litellm/   a virtualenv of its own with LiteLLM's proxy (PyPI `litellm[proxy]`)
#   perf/.peers/node/      an npm prefix with Portkey's gateway (npm `@portkey-ai/gateway`)
#   perf/.peers/smg/       a virtualenv of its own with SGLang Model Gateway (PyPI `smg`, a Rust binary
#                          in a wheel), for perf.routing_bench --quality
# perf/.peers/ is git-ignored; nothing is installed into the project's venv or globally. Each peer is
# skipped when its stamp file is newer than this script (re-run after changing the pinned versions), and a
# peer that fails to install is reported and left out: perf.bench then says "not installed" on its rows
# (perf.routing_bench leaves smg's rows out).
# Usage: scripts/bench-peers.sh [litellm] [portkey] [smg]   (all by default). Needs python3 and npm.
set -uo pipefail
cd "$(dirname "$0")/.."
LITELLM_SPEC='litellm[proxy]==1.108.7'
PORTKEY_SPEC='@portkey-ai/gateway@1.15.2'
SMG_SPEC='smg==1.13.0'
peers="$PWD/perf/.peers"
mkdir -p "$peers"
want=("$@")
[ ${#want[@]} -eq 0 ] && want=(litellm portkey smg)
status=0
for peer in "${want[@]}"; do
    stamp="$peers/.$peer-installed"
    if [ -f "$stamp" ] && [ "$stamp" -nt "$0" ]; then
        continue
    fi
    case "$peer" in
        litellm)
            echo "installing $LITELLM_SPEC into perf/.peers/litellm (its own venv)" >&2
            if python3 -m venv "$peers/litellm" \
                && "$peers/litellm/bin/pip" install -q --disable-pip-version-check "$LITELLM_SPEC"; then
                touch "$stamp"
            else
                echo "!! litellm not installed: perf.bench will skip it" >&2; status=1
            fi
            ;;
        portkey)
            if ! command -v npm >/dev/null 2>&1; then
                echo "!! npm missing: Portkey's gateway not installed (./scripts/system-deps.sh bench)" >&2
                status=1; continue
            fi
            echo "installing $PORTKEY_SPEC into perf/.peers/node (an npm prefix)" >&2
            mkdir -p "$peers/node"
            if npm install --prefix "$peers/node" --no-audit --no-fund --loglevel=error "$PORTKEY_SPEC"; then
                touch "$stamp"
            else
                echo "!! Portkey's gateway not installed: perf.bench will skip it" >&2; status=1
            fi
            ;;
        smg)
            echo "installing $SMG_SPEC into perf/.peers/smg (its own venv)" >&2
            if python3 -m venv "$peers/smg" \
                && "$peers/smg/bin/pip" install -q --disable-pip-version-check "$SMG_SPEC"; then
                touch "$stamp"
            else
                echo "!! smg not installed: perf.routing_bench will skip it" >&2; status=1
            fi
            ;;
        *) echo "unknown peer $peer (litellm, portkey, smg)" >&2; status=2 ;;
    esac
done
exit $status
