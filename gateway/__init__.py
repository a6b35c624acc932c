"""An LLM inference gateway: authenticate, authorise, limit, route and forward opaque bytes.

The package is split along the process model: ``supervisor`` forks and watches, ``controlplane`` owns the
store and builds snapshots, ``dataplane`` serves requests from the published snapshot, ``shm`` is the
shared-memory layout both sides agree on, and ``protocol`` holds sans-I/O wire-format code. ``commands``,
the command line, sits above all of them.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
