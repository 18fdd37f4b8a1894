#!/usr/bin/env bash
# What a session lent a GPU runs first for issue #16, from the project root, writing what it saw under
# $OUT (default ./gpu-out). A session now gets 15 minutes of device time in all, the machine's start
# included, so its first call should be the one that measures every target:
#
#   bash docs/scripts/gpu_session.sh first   # in one call of at most BUDGET seconds (default 420; give the
#                                            # device call a timeout_s of at least BUDGET + 60): tests, `ar`,
#                                            # `steps length`, `steps triton` (the same with --triton-kernels),
#                                            # `attention` (the Triton attention against flash's, per layer),
#                                            # `sampling` (the decode step's draw, torch against Triton),
#                                            # then `steps fused` while time is left, each
#                                            # part cut off at what remains (timeout); then targets.md: issue
#                                            # #16's targets against the figures (issue16_targets.py), all but
#                                            # the bench cell's, which `cell` measures with the GGUF carried.
#                                            # The device tool brings back at most 8 files from $OUT: the parts
#                                            # write under $PARTS_DIR (default /tmp/gpu-session/parts), packed
#                                            # into $OUT/parts.tar.gz after each part (so a call cut off keeps the
#                                            # parts done), beside targets.md, first.log and versions.txt
#
# or in parts, each fitting one call of the device tool (10 minutes):
#
#   bash docs/scripts/gpu_session.sh tests   # the CUDA tests (tests/test_cuda.py and the CPU-side ones)
#   bash docs/scripts/gpu_session.sh steps   # bench-steps on the Llama-3.1-8B shape, bucketed vs length
#                                            # (`steps bucketed`, `steps length`: one each, if both overrun a call;
#                                            # `steps separate`: bucketed with q/k/v and gate/up not colocated;
#                                            # `steps triton`: length with --triton-kernels (rope with the cache
#                                            # writes and SwiGLU as Triton kernels: 5 kernels fewer a layer; the
#                                            # norms as Triton's; the attention as the Triton attention's two
#                                            # kernels),
#                                            # `steps fused`: the fused draft mode's projection, no draft forward,
#                                            # tree 1,3,3,3 + 6 n-gram paths = at most 94 nodes (the paper's 121);
#                                            # every projection verifies the GPU's default node budget, 32 rows)
#   bash docs/scripts/gpu_session.sh ar      # AR throughput, embedded shape: graphs off / on / blocks / colocated /
#                                            # fused kernels off / length / --triton-kernels (`ar 8b`: the
#                                            # Llama-3.1-8B shape, 256 tokens)
#   bash docs/scripts/gpu_session.sh attention  # the length path's attention, flash against the Triton
#                                            # attention (--triton-kernels), per layer, 8B shape, 4K/32K/100K
#                                            # context, 1 (decoding) to 121 nodes (triton_attention_ab.py;
#                                            # `attention tune`: its tiles, warps and pipeline stages swept)
#   bash docs/scripts/gpu_session.sh sampling  # the decode step's draw, captured: torch's ops against the
#                                            # Triton kernels (--triton-kernels), 2 vocabularies x 3 presets
#                                            # (triton_sampling_ab.py)
#   bash docs/scripts/gpu_session.sh plain   # TokenSwift's plain steps vs AR steps under the paper's sampling,
#                                            # embedded shape (every step forced plain, then the adaptive loop)
#   bash docs/scripts/gpu_session.sh profile # where a decode step's GPU time goes: kernels by class, replayed and
#                                            # eager, Llama-3.1-8B shape at 4K and 100K (`profile small`: embedded shape;
#                                            # `profile triton`: the 8B shape, length attention, --triton-kernels)
#   bash docs/scripts/gpu_session.sh cell GGUF  # the embedded model's bench cell (2,048-token clockmaker prompt,
#                                            # 4,096 tokens, greedy and paper) with --lockstep, which times the
#                                            # methods together (GGUF: the model file, carried in parts)
#
# The GPU machine can download nothing and takes 64 MiB a call (the working tree, ~20 MB, included), so
# the 98 MB model goes in three warm calls (the machine releases after 30 s idle; session 51): each
# carries a 34 MB part (`split -b 34000000`, under an ignored folder such as bench-out/) and copies it to
# /tmp, the last joins them and checks the SHA-256; the gguf package, which that machine lacks, is
# installed from a carried wheel with `python3 -m pip install --no-index --no-deps` (a bare `pip` there
# installs for another Python).
#
# Nothing is installed (the machine has no network): the package runs from src/ with the machine's
# torch, and versions.txt records what was there. Every part writes versions.txt first.
set -uo pipefail
part=${1:?usage: bash docs/scripts/gpu_session.sh first|tests|steps [bucketed|length|separate|triton|fused]|ar [8b]|attention [tune]|sampling|plain|profile [small|triton]|cell GGUF}
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}

if [[ -z ${GPU_SESSION_PART:-} ]]; then  # a part that `first` runs shares its versions.txt
$py - > "$out/versions.txt" 2>&1 <<'EOF'
from importlib.metadata import PackageNotFoundError, version

import torch

print("torch", torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(no CUDA)")
for name in ("transformers", "gguf", "safetensors", "tqdm", "rich", "pytest", "hypothesis"):
    try:
        print(name, version(name))
    except PackageNotFoundError:  # a missing package is worth a line, not a stop
        print(name, "missing")
from longswift.runtime.attention import length_unsupported, varlen_features

print("flash variable-length options:", sorted(varlen_features()), "|",
      length_unsupported(torch.device("cuda")) or "--graph-attention length can run")
EOF
cat "$out/versions.txt"
fi

# `first`: one part as its own process, cut off at what is left of the budget (at most `cap` seconds), so that
# one slow part cannot take the targets' summary with it. timeout puts the part in a process group of its
# own, which a stop of this script would not reach: a stop is passed on to it.
run_part() {
  local cap=$1 left=$((budget - SECONDS - 15)) start=$SECONDS pid status
  shift
  if ((left < 30)); then
    echo "first: skipped '$*': ${left}s of the ${budget}s budget left" | tee -a "$out/first.log"
    return
  fi
  GPU_SESSION_PART=1 OUT=$parts timeout -k 10 $((cap < left ? cap : left)) bash "$0" "$@" &
  pid=$!
  trap 'kill -TERM $pid 2>/dev/null; wait $pid; exit 143' INT TERM
  wait $pid
  status=$?
  trap - INT TERM
  case $status in
    124|137) echo "first: '$*' cut off after $((SECONDS - start))s (the budget)" | tee -a "$out/first.log" ;;
    *) echo "first: '$*' exited $status after $((SECONDS - start))s" | tee -a "$out/first.log" ;;
  esac
  # the parts so far, as one file in $OUT (which brings back at most 8): kept even if this call is cut off
  tar czf "$out/parts.tar.gz" -C "$(dirname "$parts")" "$(basename "$parts")"
}

case $part in
  first)
    budget=${BUDGET:-420}
    parts=${PARTS_DIR:-/tmp/gpu-session/parts}  # outside $OUT: only parts.tar.gz goes there
    : > "$out/first.log"
    rm -rf "$parts" && mkdir -p "$parts" && cp "$out/versions.txt" "$parts/"
    run_part 150 tests
    run_part 150 ar smollm2 targets  # the embedded shape's AR (the runs its target reads): its row's only source
    run_part 240 steps length
    run_part 120 steps triton
    run_part 90 attention
    run_part 60 sampling
    run_part 150 steps fused
    $py docs/scripts/issue16_targets.py "$parts" > "$out/targets.md"
    cp "$out/targets.md" "$parts/" && tar czf "$out/parts.tar.gz" -C "$(dirname "$parts")" "$(basename "$parts")"
    cat "$out/targets.md" ;;
  tests)
    $py -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_attention.py tests/test_cuda_graphs.py \
      > "$out/tests.txt" 2>&1
    tail -30 "$out/tests.txt" ;;
  steps)
    for variant in ${2:-bucketed length}; do
      case $variant in
        separate) flags=(--graph-attention bucketed --no-pack-weights) ;;
        fused) flags=(--draft-mode fused --tree 1,3,3,3 --ngram-topk 6) ;;
        triton) flags=(--graph-attention length --triton-kernels) ;;
        *) flags=(--graph-attention "$variant") ;;
      esac
      $py -m longswift bench-steps --device cuda --shape llama-3.1-8b --contexts 4096,100000 \
        --tree-nodes 1,8,32,41,64,121 --alpha 0.8 "${flags[@]}" \
        --out "$out/steps-$variant.md" --json "$out/steps-$variant.json" > "$out/steps-$variant.log" 2>&1
      tail -25 "$out/steps-$variant.log"
    done ;;
  ar)
    [[ ${3:-} == targets ]] && export AR_MODES=targets  # (gpu_ar_throughput.py: the runs issue16_targets reads)
    case ${2:-smollm2} in
      8b) args=(llama-3.1-8b 4096 256) ;;
      *) args=(smollm2-135m 2048 1024) ;;
    esac
    $py docs/scripts/gpu_ar_throughput.py "${args[@]}" > "$out/ar-${args[0]}.txt" 2>&1
    cat "$out/ar-${args[0]}.txt" ;;
  attention)
    if [[ ${2:-} == tune ]]; then
      $py docs/scripts/triton_attention_ab.py tune > "$out/triton-attention-tune.txt" 2>&1
      cat "$out/triton-attention-tune.txt"
      exit
    fi
    $py docs/scripts/triton_attention_ab.py > "$out/triton-attention-ab.md" 2>&1
    cat "$out/triton-attention-ab.md" ;;
  sampling)
    $py docs/scripts/triton_sampling_ab.py > "$out/triton-sampling-ab.md" 2>&1
    cat "$out/triton-sampling-ab.md" ;;
  plain)
    for mode in plain adaptive; do
      $py docs/scripts/plain_step_ab.py $mode paper 1024 4 shape > "$out/plain-$mode.txt" 2>&1
      tail -3 "$out/plain-$mode.txt"
    done ;;
  profile)
    if [[ ${2:-} == triton ]]; then
      $py docs/scripts/gpu_step_profile.py llama-3.1-8b 4096,100000 "" length triton \
        > "$out/profile-llama-3.1-8b-length-triton.txt" 2>&1
      cat "$out/profile-llama-3.1-8b-length-triton.txt"
      exit
    fi
    case ${2:-8b} in
      small) args=(smollm2-135m 2048) ;;
      *) args=(llama-3.1-8b 4096,100000) ;;
    esac
    for attention in bucketed length; do
      $py docs/scripts/gpu_step_profile.py "${args[@]}" "" $attention > "$out/profile-${args[0]}-$attention.txt" 2>&1
      cat "$out/profile-${args[0]}-$attention.txt"
    done ;;
  cell)
    model=${2:?cell needs the GGUF model file: bash docs/scripts/gpu_session.sh cell MODEL.gguf}
    $py -m longswift bench --model "$model" --device cuda --methods ar,tokenswift,tokenswift-fused \
      --prompt-file docs/prompts/clockmaker.txt --prefix 2048 --lengths 4096 --presets greedy,paper --runs 2 \
      --lockstep --out-dir "$out/cell" > "$out/cell.log" 2>&1
    tail -5 "$out/cell.log"
    grep -A8 '^### ' "$out/cell/report.md" ;;
  *)
    echo "unknown part '$part': use first, tests, steps, ar, attention, sampling, plain, profile or cell" >&2
    exit 2 ;;
esac
