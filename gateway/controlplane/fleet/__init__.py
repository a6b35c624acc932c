"""The hosts of a cluster and what each knows of its backends.

``reports`` is a host's health report and the control plane's view of the fleet; ``shares`` splits rate
limits across proxy hosts, from the scopes' recent traffic (``traffic``) and what the hosts hold
(``holdings``); ``remote`` is a proxy-role host's control slot, which follows a remote control
plane and spools usage (``spool``) while it is away; ``engines`` is the engine scraper every host's
control slot runs. Importing this package does no I/O.
"""
