"""``python -m gateway`` is the same as the ``gateway`` console script."""

from gateway.commands.main import main

raise SystemExit(main())
