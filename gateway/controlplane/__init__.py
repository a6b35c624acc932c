"""The control plane: the store (configuration, principals, API keys, usage), the declarative config file,
the snapshot builder that turns the store into the versioned document the data plane reads, and the
control worker that publishes it, serves the admin port and drains usage.

``worker`` is the control worker and ``snapshot_build`` the builder; the rest is by concept: ``config``
(the file), ``store``, ``api`` (the admin port), ``usage`` (records after the request), ``fleet`` (the
hosts of a cluster), ``credentials`` (backend credentials at rest) and ``ui`` (the web UI's files).
Importing this package does no I/O.
"""
