"""Benchmarks: the grid next to peers (grid, metrics, peers, plots, prompts, report) and bench-steps
(steps, projection, shapes, steps_report)."""
