"""Where a request goes: compiled routing rules, pool policies, and the one ``decide`` function the request
path and the admin dry run share. Pure: it reads the snapshot and a ``Load`` view, and does no I/O."""
