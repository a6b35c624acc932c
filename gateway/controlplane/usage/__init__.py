"""Usage after the request: the records the proxy workers write, from the rings to the store and beyond.

``sink`` drains the usage rings into the store and keeps the budgets' base spend; ``metrics`` counts what
it drains for ``/metrics``; ``otel`` exports the sampled requests' spans; ``budget_alerts`` notices
budgets crossing their thresholds; ``requests_view`` is the flight recorder and a request as an operator
reads it; ``spend`` turns stored usage into the documents ``gateway usage``, ``gateway budgets`` and the
admin API show; ``time_range`` reads the ``since`` / ``until`` they take; ``retention`` purges old
records. Importing this package does no I/O.
"""
