"""Body logs on the control side: what the ``[[body_logs]]`` entries redact (``redaction``, ``truncated``),
a worker's frame made into a stored row (``stored``, with ``rules`` choosing the redaction by the entry
that logged it), the drain of the proxy workers' body rings into the store (``sink``) and retention
(``retention``). The workers' side is ``gateway.dataplane.body_log``; the contract between them is
``gateway.body_record``.
"""
