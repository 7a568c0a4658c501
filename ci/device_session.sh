#!/usr/bin/env bash
# One device call from a clean clone, its steps chosen by the card that came (docs/gpu.md, "One call, either card").
# Why: a call that asks for the H200 may be given an 80 GB H100, where the H200's runs (the merged gate in one call,
# the 36-layer steps at batch 256) do not fit; and a fresh machine is scarce, so a call must not be spent on a plan
# that cannot run there. The command names a mode for each card; this script clones the checkout (RUN_COMMIT, default
# HEAD) into CLONE_DIR (or, given SOURCE_COMMIT and SOURCE_TREE, runs the files that came in place, see below),
# copies the carried wheels (.whl) and CPU shards (out/cpu-*) into it, reads the card's memory,
# and runs that card's mode through ci/device_gpu_run.sh. What it chose goes to $OUT/session.txt.
#   MODE_H200=merged MODE_H100=merged-1 MERGED_CPU=out/cpu-<sha> bash ci/device_session.sh
# Modes (SESSION_LIMIT caps the steps' wall time where a mode has no limit of its own):
#   merged    both arch sessions and the merged gate in one step (needs MERGED_CPU, the CPU shard of RUN_COMMIT)
#   merged-1  the first half on an 80 GB card: the Triton profile, the baseline and every GPU test
#   merged-2  the second half: both CUDA profiles beside the sm86 session
#   merged-80g both halves and the merged gate in one call on an 80 GB card (needs MERGED_CPU): merged-1, then
#             merged-2, each under its own limit (MERGED1_LIMIT 290 s, MERGED2_LIMIT 260 s), then the gate; no warm
#             machine has to be caught between two calls
#   steps     the step ops replayed in C++ (launch), the 36-layer chain on every tier, decode at batch 1, 64 and
#             256 with 2048 cached tokens and the 8192-token training step, then the host cost of every step op
#   steps-80g the same within 80 GB: decode at batch 1 and 64, no training step
#   validate  the C++ step path's GPU tests with the step tests, the host cost, and the chain at 2 layers
#   attn90-bwd the build, the Hopper attention backward's GPU tests and its timing beside SDPA (a short call)
#   attn90-san the build, then memcheck and racecheck over the Hopper attention (a short call)
#   attn90    the Hopper attention forward (cuda_bf16_sm90): the build, its GPU tests and the step path's, its matrix
#             cells on every tier, its bench rows, memcheck and racecheck
#   script    bash SCRIPT_FILE (carried in the ignored out/) as one step, the commit stated: a follow-up's own commands
#   profiles  some profiles' matrices alone (PROFILES=a,b), with the builds and no GPU tests (PROFILES_LIMIT 300 s)
#   tiled     the tensor-core attention forward (cuda_bf16): its GPU tests, its matrix cells on every tier, its bench
set -u
need() {  # need NAME: a one-line error and exit 2 when the variable is empty
  [ -n "${!1:-}" ] || { echo "device_session: set $1 ($2)"; exit 2; }
}
need OUT "an output folder"
cd "$(dirname "$0")/.." || exit 2
# The machine's copy can hold files newer than its git metadata (a warm machine kept the .git of the call that
# started it, while each call brings the current files): a clone of HEAD would then run older code than the files
# that came, and its evidence would name the wrong commit. So either the files are HEAD's, checked, and the clone
# runs; or SOURCE_COMMIT and SOURCE_TREE (`git rev-parse <commit>^{tree}` where the commit is) name what came,
# the files are hashed into a tree here and compared, and they run in place, the evidence stating SOURCE_COMMIT.
if [ -n "${SOURCE_COMMIT:-}" ]; then
  # the harness takes only a full commit (a short one failed every step of a call after its build, on 2026-12-07):
  # refuse it here, before any device time is spent
  [[ "$SOURCE_COMMIT" =~ ^[0-9a-f]{40}$ ]] || {
    echo "device_session: SOURCE_COMMIT must be the full 40-hex commit (git rev-parse <commit>), got $SOURCE_COMMIT"
    exit 2
  }
  need SOURCE_TREE "the tree of SOURCE_COMMIT: git rev-parse SOURCE_COMMIT^{tree}"
  idx=$(mktemp -u)
  tree=$(GIT_INDEX_FILE=$idx git add -A . 2>/dev/null && GIT_INDEX_FILE=$idx git write-tree)
  rm -f "$idx"
  [ "$tree" = "$SOURCE_TREE" ] || {
    echo "device_session: the files here are tree ${tree:-unreadable}, not SOURCE_TREE $SOURCE_TREE of $SOURCE_COMMIT"
    exit 2
  }
  export WS1_SOURCE_COMMIT=$SOURCE_COMMIT WS1_SOURCE_DIRTY=0
else
  [ -z "$(git status --porcelain 2>&1)" ] || {
    echo "device_session: the files here differ from this checkout's HEAD $(git rev-parse --short HEAD 2>&1) (git" \
      "metadata older than the files?): give SOURCE_COMMIT and SOURCE_TREE"
    exit 2
  }
  clone=${CLONE_DIR:-/tmp/ws1-device-clone}
  rm -rf "$clone"
  git clone -q . "$clone" || { echo "device_session: git clone failed"; exit 2; }
  [ -d .whl ] && cp -r .whl "$clone/"
  mkdir -p "$clone/out"
  for d in out/cpu-*; do [ -d "$d" ] && cp -r "$d" "$clone/out/"; done
  cd "$clone" || exit 2
  if [ -n "${RUN_COMMIT:-}" ]; then
    git checkout -q "$RUN_COMMIT" 2>/dev/null || { echo "device_session: no commit $RUN_COMMIT in the checkout"; exit 2; }
  fi
fi
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
case "$mem" in ''|*[!0-9]*) echo "device_session: nvidia-smi gave no memory size ($mem)"; exit 2 ;; esac
if [ "$mem" -gt 100000 ]; then card=H200; else card=H100; fi
need "MODE_$card" "the mode for a card of $mem MiB"
mode_var="MODE_$card"
mode=${!mode_var}
{ echo "commit ${SOURCE_COMMIT:-$(git rev-parse HEAD)}"; echo "memory_mib $mem"; echo "mode $mode"; } | tee "$OUT/session.txt"
limit=${SESSION_LIMIT:-570}
run=(bash ci/device_gpu_run.sh)
native_tests="python3 -m pytest -q -p no:cacheprovider -rfE tests/ws1_kernels/test_step_native_gpu.py"
case "$mode" in
  merged)   need MERGED_CPU "the CPU shard's folder of this commit"
            MERGED_LIMIT=${MERGED_LIMIT:-540} NOX_GLOBAL='' "${run[@]}" merged ;;
  merged-1|merged-2) MERGED_LIMIT=${MERGED_LIMIT:-540} NOX_GLOBAL='' "${run[@]}" "$mode" ;;
  merged-80g) need MERGED_CPU "the CPU shard's folder of this commit"
            MERGED1_LIMIT=${MERGED1_LIMIT:-290} MERGED2_LIMIT=${MERGED2_LIMIT:-260} NOX_GLOBAL='' \
              "${run[@]}" merged-1 merged-2 merged-gate ;;
  # the chain's three tiers at 36 layers took about 300 s at 1a8e22b on the H200 (the weights, short 97 s, primary
  # 73 s, long about 110 s), past the 240 s this step had; the steps' bench took 87 s
  steps)    BENCH_ARGS="--layers 36 --op decode_step --op train_step --batch 1 --batch 64 --batch 256 --cache 2048" \
            CHAIN_LAYERS=36 CHAIN_TIERS="short primary long" CHAIN_LIMIT=320 BENCH_LIMIT=160 HOST_LIMIT=40 \
            timeout "$limit" "${run[@]}" launch chain bench host ;;
  steps-80g) BENCH_ARGS="--layers 36 --op decode_step --batch 1 --batch 64 --cache 2048" \
            CHAIN_LAYERS=36 CHAIN_TIERS="short primary long" CHAIN_LIMIT=300 BENCH_LIMIT=160 HOST_LIMIT=40 \
            timeout "$limit" "${run[@]}" launch chain bench host ;;
  validate) SCRIPT_NAME=native-tests SCRIPT_LIMIT=150 HOST_LIMIT=45 CHAIN_LAYERS=2 CHAIN_TIERS="short primary long" \
            CHAIN_LIMIT=120 SCRIPT="$native_tests tests/ws1_kernels/test_triton_step_gpu.py tests/ws1_kernels/test_step_runner_gpu.py" \
            timeout "$limit" "${run[@]}" launch script host chain ;;
  tiled)    timeout "$limit" "${run[@]}" tiled ;;
  attn90)   timeout "$limit" "${run[@]}" hopper-build attn90 ;;
  attn90-bwd) timeout "$limit" "${run[@]}" hopper-build attn90-bwd ;;
  attn90-san) timeout "$limit" "${run[@]}" hopper-build attn90-san ;;
  # a follow-up call's own commands: bash SCRIPT_FILE (a file in the git-ignored out/, carried, so the checkout
  # stays at its commit) as the runner's `script` step, with the commit checked and stated as in every mode. Why: a
  # follow-up run straight through device_gpu_run.sh (2026-12-07, followup-h100-f0cdef1) recorded the machine's
  # older git commit in its bench files
  script)   need SCRIPT_FILE "the follow-up's script, e.g. out/followup.sh"
            [ -f "$SCRIPT_FILE" ] || { echo "device_session: SCRIPT_FILE $SCRIPT_FILE is not a file here"; exit 2; }
            SCRIPT_NAME=${SCRIPT_NAME:-script} SCRIPT="bash $SCRIPT_FILE" timeout "$limit" "${run[@]}" script ;;
  # when one profile's evidence went stale and too little time is left for a merged run (2026-12-07: an 80 GB H100
  # with 376 s, hopper-h100-3e8dae1)
  profiles) need PROFILES "the profiles to run, comma-separated, e.g. cuda_bf16_sm90"
            [[ "$PROFILES" =~ ^[a-z0-9_]+(,[a-z0-9_]+)*$ ]] || {
              echo "device_session: PROFILES must be profile names separated by commas, got $PROFILES"; exit 2; }
            NOX_GLOBAL='' timeout "$limit" "${run[@]}" profiles ;;
  *) echo "device_session: unknown mode $mode"; exit 2 ;;
esac
rc=$?
# a step cut by the limit leaves no archive: pack what is there
[ -f "$OUT/evidence.tgz" ] || { [ -d "$OUT/ev" ] && tar czf "$OUT/evidence.tgz" -C "$OUT" ev; }
exit "$rc"
