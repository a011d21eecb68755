"""Compute kernels: paged attention and state-space scans, with a pure-torch path everywhere."""
