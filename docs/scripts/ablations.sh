#!/bin/bash
# TokenSwift ablations on the embedded model (issue #5): one results directory, one invocation per variant.
set -e
cd "$(dirname "$0")/../.."  # the repository root; rerunning resumes into the same directory
export OMP_NUM_THREADS=1
OUT=${OUT:-docs/bench/ablations}
BASE="longswift bench --methods ar,tokenswift --prompt-file docs/prompts/clockmaker.txt --prefix 2048 --lengths 2048 --presets greedy,paper --runs 1 --threads 1 --draft-kv-budget 1024 --draft-window 256 --no-adaptive --out-dir $OUT"
$BASE
$BASE --draft-cache static
$BASE --draft-cache full
$BASE --ngram-topk 0
$BASE --tree 1,3,3,3 --ngram-topk 20
longswift bench --methods ar,tokenswift --prompt-file docs/prompts/clockmaker.txt --prefix 2048 --lengths 2048 --presets paper-nopenalty --runs 1 --threads 1 --draft-kv-budget 1024 --draft-window 256 --no-adaptive --out-dir $OUT
