#!/usr/bin/env bash
# Installs the Debian packages a target needs, only when missing (CI starts from a machine with none).
#   system-deps.sh test    what `make test` drives for real (git, PostgreSQL, haproxy, Chromium, npm...)
#   system-deps.sh bench   what `make bench` drives (nginx as mock upstream and reference proxy, wrk; npm
#                          for the Node peer that scripts/bench-peers.sh installs)
#   system-deps.sh profile what `make profile-native` runs the C parts under (valgrind)
set -euo pipefail
want=()
need() { command -v "$1" >/dev/null 2>&1 || [ -x "$2" ] || want+=("$3"); }
case "${1:-test}" in
    test)
        need git /usr/bin/git git
        need openssl /usr/bin/openssl openssl   # the TLS tests make their own throwaway CA
        need haproxy /usr/sbin/haproxy haproxy  # the load-balancer test: reload and restart under load
        need chromium /usr/bin/chromium chromium  # tests/browser/: the admin UI, driven by Playwright
        need npm /usr/bin/npm npm  # scripts/agents.sh installs Claude Code and the Codex CLI with it
        # The server binaries live outside PATH on Debian (/usr/lib/postgresql/N/bin); any N will do.
        ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || want+=(postgresql)
        ;;
    bench)
        need nginx /usr/sbin/nginx nginx-light
        need wrk /usr/bin/wrk wrk
        need npm /usr/bin/npm npm  # scripts/bench-peers.sh installs Portkey's gateway (Node) with it
        ;;
    profile)
        need valgrind /usr/bin/valgrind valgrind
        ;;
esac
if [ ${#want[@]} -gt 0 ]; then
    echo "installing Debian packages: ${want[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
fi
