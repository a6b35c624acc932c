"""What the control worker's admin port serves: the admin API (``admin``, its route table, with handlers
by concept in ``sessions``, ``keys``, ``configuration``, ``reports`` and ``dry_run``, on the types in
``calls``) and the cluster API with ``/metrics`` and the web UI (``cluster``, the port's RSGI
application), reading bodies no further than a limit (``request_body``). Importing this package does no
I/O.
"""
