"""Benchmark metrics computed as the benchmarks' own tools compute them, and the prediction files
their leaderboards accept."""
