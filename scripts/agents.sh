#!/usr/bin/env bash
# Installs the coding-agent CLIs that `make test` drives against the gateway, at the versions pinned in
# .agents/package.json and .agents/package-lock.json: Claude Code (@anthropic-ai/claude-code) and the
# Codex CLI (@openai/codex). They land in .agents/node_modules/ (git-ignored); nothing is installed
# globally. Re-run only when the lock file changed since the last install. Needs npm (system-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/../.agents"
stamp=node_modules/.installed
if [ -f "$stamp" ] && [ "$stamp" -nt package-lock.json ] && [ "$stamp" -nt package.json ]; then
    exit 0
fi
echo "installing the coding-agent CLIs into .agents/ (npm ci)" >&2
# Claude Code's postinstall script puts its native binary in place: scripts must run.
npm ci --no-audit --no-fund --loglevel=error
touch "$stamp"
