"""Shared-memory layout the supervisor creates and every worker maps: the snapshot slots, and (from the
rate-limit work on) the token buckets and counters. Nothing here does network I/O."""
