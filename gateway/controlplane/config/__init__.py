"""The declarative configuration: what a config file may say, and how it gets into the store.

``specs`` holds the frozen document (``ConfigDoc``) and its entries; ``values`` the checks every value
passes wherever it comes from; ``parser`` reads a TOML file or table into a ``ConfigDoc`` (with
``backends``, ``routing``, ``fields``, ``problems`` and ``toml_places`` for its parts); ``writer`` writes
one back as TOML; ``routing_rows`` is the store's form of the routing entries; ``apply`` applies a file
to the store as the owner of what it declares. Importing this package does no I/O.
"""
