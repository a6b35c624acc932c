#!/usr/bin/env bash
# Runs the whole suite. pytest exits 5 when it collected nothing: that is a failure here, said plainly.
set -uo pipefail
cd "$(dirname "$0")/.."
# system-deps.sh installed PostgreSQL, haproxy and openssl: tests that need them must not skip for want of them.
export GATEWAY_TEST_STRICT=1
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: treating that as a failure" >&2
    exit 1
fi
exit "$rc"
