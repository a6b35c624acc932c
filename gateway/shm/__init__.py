"""Shared memory between the processes of one host: ``regions.py`` declares every segment, its size and
its layout's module, and creates them (the supervisor) or attaches to them (``gateway status``);
``segment.py`` is one SysV segment; ``snapshot_slot.py``, ``worker_stats.py`` and ``holdings.py`` lay out
the segments written from Python, ``gateway.native`` the two whose words are C atomics (the bucket table,
the usage rings); ``bucket_keys.py`` names the buckets. Nothing here does network I/O."""
