"""`longswift bench-steps`' defaults, apart from the measuring code so that the command line shows them without
importing torch (bench/steps.py's StepBenchConfig takes them)."""

GPU_CONTEXTS = (20000, 50000, 100000)
CPU_CONTEXTS = (2048, 4096, 8192)
TREE_NODES = (1, 4, 8, 16, 32, 64)
GPU_NEW_TOKENS = 100000
PAPER_PREFIX = 4096  # the paper's prefix length (LLaMA3.1-8B results)
REPS = 10  # timed repetitions per cost
WARMUP = 2  # untimed repetitions before them
SEED = 0  # of the random weights, caches and tries
