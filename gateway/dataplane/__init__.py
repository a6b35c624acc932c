"""The per-worker request path: authenticate, resolve, authorise, forward, relay.

Imports nothing from ``gateway.controlplane``: the published snapshot is the only contract between the
planes (a test enforces the rule)."""
