"""Benchmarks: the grid next to peers (grid, lockstep, metrics, peers, plots, prompts, timing; its
results directory in store, the report in report and machine) and bench-steps (steps, projection,
shapes, steps_report)."""
