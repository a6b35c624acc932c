"""The ``gateway`` command line: one module per command family, assembled by ``main``.

``serve`` (serve, status), ``apply`` (apply, export), ``keys``, ``principals``, ``secrets_key``
(secrets rotate), ``usage`` (usage, budgets), ``requests`` (requests show) and ``mock_engine``; ``options``
and ``output`` hold what they share. This package sits above everything else: it imports the rest of the
gateway, and nothing in the gateway imports it but ``gateway.__main__`` (a test keeps it so). Importing
this package does no I/O.
"""
