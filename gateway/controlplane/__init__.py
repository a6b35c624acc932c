"""The control plane: the store (configuration, principals, API keys), the declarative config file, the
snapshot builder that turns the store into the versioned document the data plane reads, and the CLI
subcommands that manage them. Importing this package does no I/O.
"""
