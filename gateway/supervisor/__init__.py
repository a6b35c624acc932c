"""The parent process: creates shared memory, forks the control and proxy workers, watches them,
restarts the ones that die, forwards reloads and drains on shutdown."""
