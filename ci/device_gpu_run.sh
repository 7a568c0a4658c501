#!/usr/bin/env bash
# One GPU call on a bare H200 machine with no package registry: install the carried wheels, then run the GPU
# harness steps named in the arguments, each under its own time limit, writing logs and evidence under $OUT.
# This is how the GPU evidence in docs/evidence/ was produced; see docs/gpu.md.
#   bash ci/device_gpu_run.sh native triton tests bench
# Each step's log lands in $OUT/<step>.log; the evidence folders are packed into $OUT/evidence.tgz at the end.
set -u
cd "$(dirname "$0")/.." || exit 2
: "${OUT:?set OUT to an output folder}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 2
export PYTHONUNBUFFERED=1 WS1_REQUIRE_GPU=1
args=()
for p in packages/ws1-contract packages/ws1-workload packages/ws1-kernels packages/ws1-harness; do args+=(-e "$p"); done
python3 -m pip install -q --no-deps --no-build-isolation --no-index "${args[@]}" || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
ev="$OUT/ev"; mkdir -p "$ev"
T0=$(date +%s)
step() {  # step NAME LIMIT_S COMMAND...: run with a limit, log, print the wall time and exit status
  local name=$1 limit=$2; shift 2
  local t
  t=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "step $name: rc=$rc wall=$(( $(date +%s) - t ))s (since start $(( $(date +%s) - T0 ))s)" | tee -a "$OUT/steps.txt"
  tail -n 25 "$OUT/$name.log"
}
tiers=(--tier short --tier primary --tier long)
for s in "$@"; do
  case "$s" in
    native) step native "${NATIVE_LIMIT:-240}" ws1 matrix --profile native_torch "${tiers[@]}" --cell-timeout 120 --out "$ev/native_torch" --force
            ws1 report "$ev"/native_torch/*.json --out "$ev/native_torch" > /dev/null ;;
    triton) step triton "${TRITON_LIMIT:-420}" ws1 matrix --profile triton_cuda_bf16 "${tiers[@]}" --cell-timeout 150 --out "$ev/triton_cuda_bf16" --force
            ws1 report "$ev"/triton_cuda_bf16/*.json --out "$ev/triton_cuda_bf16" > /dev/null
            ws1 gate "$ev"/triton_cuda_bf16/*.json | head -40 ;;
    tests)  step tests "${TESTS_LIMIT:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests ;;
    bench)  step bench "${BENCH_LIMIT:-300}" ws1 bench --profile "${BENCH_PROFILE:-triton_cuda_bf16}" --out "$ev/bench" --force ${BENCH_ARGS:-} ;;
    sdpa)   step sdpa "${SDPA_LIMIT:-240}" python3 ci/sdpa_probe.py --lengths "${SDPA_LENGTHS:-60}" ;;
    calib)  step calib "${CALIB_LIMIT:-300}" python3 ci/calibrate_thresholds.py --device cuda --model qwen3-8b \
              ${CALIB_PROFILES:---profile triton_cuda_bf16 --profile native_torch} --tier short --tier primary --tier long \
              --seeds "${CALIB_SEEDS:-4}" --out "$ev/calib" ;;
    chain)  ct=""; for t in ${CHAIN_TIERS:-}; do ct+=" --tier $t"; done
            step chain "${CHAIN_LIMIT:-300}" bash -c "ws1 chain --profile triton_cuda_bf16 --model qwen3-8b --layers ${CHAIN_LAYERS:-2}$ct --out $ev/chain; echo triton rc=\$?; ws1 chain --profile native_torch --model qwen3-8b --layers ${CHAIN_LAYERS:-2} --tier short --out $ev/chain; echo native rc=\$? - 1 expected: the negative control" ;;
    prof)   step prof "${PROF_LIMIT:-150}" python3 ci/profile_unit.py ${PROF_UNIT:-native_torch attention long} ;;
    # Nsight Compute's speed-of-light figures for chosen kernels, one bench point each: NCU_CASES holds
    # op:shape:M:kernel-regex items; the 4th launch of a matching kernel is profiled (after warm-up).
    ncu)    for c in ${NCU_CASES:-det_gemm:down:4096:ws1_gemm}; do
              IFS=: read -r op shp m kre <<< "$c"
              step "ncu-$op-$shp-$m" "${NCU_LIMIT:-90}" ncu --clock-control none --section SpeedOfLight \
                --section MemoryWorkloadAnalysis -k "regex:$kre" --launch-skip 3 --launch-count 1 \
                ws1 bench --profile triton_cuda_bf16 --op "$op" --shape "$shp" --m "$m" --warmup-ms 2 --rep-ms 5 \
                --out "$ev/ncu/$op-$shp-$m" --force
            done ;;
    tune)   step tune "${TUNE_LIMIT:-240}" python3 ci/tune_kernels.py --out "$ev/tune.json" ${TUNE_ARGS:-} ;;
    # the Triton host cost at M = 1 as shipped (the bound fast path) and through Triton's own launch, one file each
    host)   step host-fast "${HOST_LIMIT:-120}" python3 ci/host_cost_triton.py --out "$ev/host-fast.json"
            step host-jit "${HOST_LIMIT:-120}" env WS1_TRITON_LAUNCH=jit python3 ci/host_cost_triton.py --out "$ev/host-jit.json" ;;
    script) step "${SCRIPT_NAME:-script}" "${SCRIPT_LIMIT:-240}" bash -c "${SCRIPT:?set SCRIPT}" ;;
    # some profiles' matrices alone (PROFILES, comma-separated), full widths and tiny, each in its own virtualenv,
    # with the session's builds and no GPU tests (NOX_SESSION, default gpu_sm90): for when a kernel change stales
    # one profile's evidence and the device time left is short of a merged run (hopper-h100-3e8dae1, in git history)
    profiles) pa=(); IFS=, read -ra ps <<< "${PROFILES:?set PROFILES}"
              for p in "${ps[@]}"; do pa+=(--profile "$p"); done
              step profiles "${PROFILES_LIMIT:-300}" env WS1_OUT="$ev" python3 -m nox ${NOX_GLOBAL-} \
                -s "${NOX_SESSION:-gpu_sm90}" -- "${pa[@]}" --no-tests ;;
    # the Hopper module's own checks in one step: build both modules (build/cuda-gpu_sm90 and its hopper/ folder,
    # where nox -s gpu_sm90 puts them, so a later `nox ... --no-build` reuses them), every Hopper GPU test (marked sm90),
    # `ws1 bench --profile cuda_bf16_sm90` (HOPPER_BENCH_ARGS, default linear_logp and lm_head at 64, 512 and 4096
    # rows), then memcheck and racecheck over ci/sanitize_logp_sm90.py; one log each under $OUT/hopper-*.log
    # hopper-build: the build alone (for a call whose later steps need it: wgrad, or merged-2's reuse of it)
    hopper|hopper-build) hb="$PWD/build/cuda-gpu_sm90"
            step hopper-build "${HOPPER_BUILD_LIMIT:-240}" bash -c "mkdir -p $hb/hopper && \
              TORCH_CUDA_ARCH_LIST='8.0;9.0a' WS1_MODULES=generic MAX_JOBS=8 python3 csrc/setup.py build_ext \
                --build-lib $hb --build-temp $hb/tmp-generic & \
              TORCH_CUDA_ARCH_LIST='8.0;9.0a' WS1_MODULES=hopper MAX_JOBS=8 python3 csrc/setup.py build_ext \
                --build-lib $hb/hopper --build-temp $hb/tmp-hopper & wait"
            [ "$s" = hopper-build ] && continue
            hp="$hb:$hb/hopper:${PYTHONPATH:-}"
            step hopper-tests "${HOPPER_TESTS_LIMIT:-240}" env PYTHONPATH="$hp" python3 -m pytest -q -p no:cacheprovider \
              -rfE -m "gpu and sm90" tests/ws1_kernels
            step hopper-bench "${HOPPER_BENCH_LIMIT:-240}" env PYTHONPATH="$hp" ws1 bench --profile cuda_bf16_sm90 \
              ${HOPPER_BENCH_ARGS:---op linear_logp --op lm_head --m 64 --m 512 --m 4096} --out "$ev/hopper-bench" --force
            for tool in memcheck racecheck; do
              step "hopper-$tool" "${HOPPER_SANITIZE_LIMIT:-120}" env PYTHONPATH="$hp" compute-sanitizer --tool "$tool" \
                --error-exitcode 1 python3 ci/sanitize_logp_sm90.py
            done ;;
    # the Hopper weight gradient's variants against cuBLAS in one process (ci/wgrad_tiles_sm90.py with WGRAD_ARGS,
    # figures in $ev/wgrad-tiles.json), then ncu of its wgmma kernel (drive_sm90_op.py --op wgrad WGRAD_NCU_ARGS,
    # default the wired variant), its gather, and cuBLAS's dy.T @ x at the lm_head shape and 4096 rows: speed of light,
    # memory, warp states, scheduler, occupancy and source counters, one log each. Needs the hopper step's build
    wgrad)  hb="$PWD/build/cuda-gpu_sm90"; hp="$hb:$hb/hopper:${PYTHONPATH:-}"
            step wgrad-tiles "${WGRAD_LIMIT:-240}" env PYTHONPATH="$hp" python3 ci/wgrad_tiles_sm90.py ${WGRAD_ARGS:-} \
              --out "$ev/wgrad-tiles.json"
            for c in "kernel:wgrad:ws1_sm90_wgrad_wgmma:2" "gather:wgrad:ws1_sm90_wgrad_gather:4" \
                     "cublas:cublas_wgrad:nvjet|gemm|xmma|cutlass:2"; do
              IFS=: read -r label op kre skip <<< "$c"
              step "ncu-wgrad-$label" "${NCU_LIMIT:-90}" env PYTHONPATH="$hp" ncu --clock-control none \
                --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
                --section SchedulerStats --section Occupancy --section SourceCounters -k "regex:$kre" \
                --launch-skip "$skip" --launch-count 1 python3 ci/drive_sm90_op.py --op "$op" --m 4096 --iters 4 \
                ${WGRAD_NCU_ARGS:-}
            done ;;
    # the step ops' C++ host path (docs/step.md): build ws1_launch_ext into build/launch and put it on the path of
    # every later step of the call, so `bench`, `chain` and `host` run the step ops replayed (without it: Python)
    launch) step launch-build "${LAUNCH_LIMIT:-180}" python3 csrc/launch/setup.py build_ext \
              --build-lib "$PWD/build/launch" --build-temp "$PWD/build/tmp-launch"
            export PYTHONPATH="$PWD/build/launch:${PYTHONPATH:-}" ;;
    # NOX_GLOBAL: nox's own flags (default --no-venv: one environment; empty: each profile in its own venv)
    nox)    step "${NOX_SESSION:-gpu_sm90}" "${NOX_LIMIT:-500}" python3 -m nox ${NOX_GLOBAL---no-venv} -s "${NOX_SESSION:-gpu_sm90}" -- ${NOX_ARGS:-} ;;
    # compute-sanitizer over one forward and one backward of every candidate of SANITIZE_PROFILE (cuda_bf16) at
    # small, odd shapes (ci/sanitize_cuda.py: the bench's inputs at the tiny widths, candidates only); only the
    # kernels whose name holds SANITIZE_KNS are instrumented (ws1_: the generic build; device_kernel: the Hopper
    # build's CUTLASS kernels). Needs the extension on PYTHONPATH (SANITIZE_BUILD).
    sanitize) for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
              step "sanitize-$tool" "${SANITIZE_LIMIT:-240}" env PYTHONPATH="${SANITIZE_BUILD:?set SANITIZE_BUILD}:$PYTHONPATH" \
                compute-sanitizer --tool "$tool" --kernel-name "kns=${SANITIZE_KNS:-ws1_}" --error-exitcode 1 --print-limit 50 \
                python3 ci/sanitize_cuda.py --profile "${SANITIZE_PROFILE:-cuda_bf16}" ${SANITIZE_M:---m 1 --m 7 --m 33}
            done ;;
    # the merged run (docs/gpu.md): both arch sessions at this commit, at once (each profile in its own venv; they
    # share the card's GPU slots through lock files), then the merged gate over their shards and the CPU shard of
    # the same commit, a folder named by MERGED_CPU and carried to the machine (out/ is git-ignored, so `carry` takes
    # it); MERGED_EXPECT overrides the plan
    merged) step merged "${MERGED_LIMIT:-570}" bash -c "for s in gpu_sm86 gpu_sm90; do \
              ( WS1_OUT=$ev python3 -m nox ${NOX_GLOBAL-} -s \$s > $OUT/nox-\$s.log 2>&1; \
                echo \"\$s rc=\$? after \$SECONDS s\" ) & done; wait; \
              WS1_OUT=$ev python3 ci/merged_gate.py ${MERGED_CPU:?set MERGED_CPU} $ev/gpu_sm86 \
              $ev/gpu_sm90 --no-venv ${MERGED_EXPECT:---expect portable_cpu:short+primary --expect triton_cuda_bf16@sm90 \
              --expect cuda_bf16@sm90 --expect cuda_bf16_sm90@sm90 --expect cuda_bf16@sm86-proxy}" ;;
    # the merged run on an 80 GB H100 (2 GPU slots), where both sessions (about 900 s of GPU commands) do not fit one
    # call: two calls on one machine at one commit, as at 473ee98 (docs/gpu.md). merged-1: the Triton profile, the
    # baseline and every GPU test; merged-2: both CUDA profiles beside the sm86 session. Then ci/merged_gate.py over
    # the CPU folder and the three session folders ($OUT/ev/part1/gpu_sm90, part2/gpu_sm86, part2/gpu_sm90), on
    # the CPU host or on the machine
    merged-1) step merged-1 "${MERGED1_LIMIT:-${MERGED_LIMIT:-560}}" env WS1_OUT="$ev/part1" python3 -m nox ${NOX_GLOBAL-} -s gpu_sm90 \
                -- --profile triton_cuda_bf16 --profile native_torch ;;
    merged-2) step merged-2 "${MERGED2_LIMIT:-${MERGED_LIMIT:-560}}" bash -c "( WS1_OUT=$ev/part2 python3 -m nox ${NOX_GLOBAL-} \
                -s gpu_sm86 > $OUT/nox-gpu_sm86.log 2>&1; echo \"gpu_sm86 rc=\$? after \$SECONDS s\" ) & \
                ( WS1_OUT=$ev/part2 python3 -m nox ${NOX_GLOBAL-} -s gpu_sm90 -- --profile cuda_bf16 \
                --profile cuda_bf16_sm90 --no-tests > $OUT/nox-gpu_sm90.log 2>&1; \
                echo \"gpu_sm90 rc=\$? after \$SECONDS s\" ) & wait" ;;
    # the merged gate over merged-1's and merged-2's folders and the CPU shard (MERGED_CPU), on the machine, after
    # both in the same call (device_session.sh's merged-80g)
    merged-gate) step merged-gate "${MERGED_GATE_LIMIT:-60}" env WS1_OUT="$ev" python3 ci/merged_gate.py \
                "${MERGED_CPU:?set MERGED_CPU}" "$ev/part1/gpu_sm90" "$ev/part2/gpu_sm86" "$ev/part2/gpu_sm90" --no-venv \
                ${MERGED_EXPECT:---expect portable_cpu:short+primary --expect triton_cuda_bf16@sm90 --expect cuda_bf16@sm90 \
                --expect cuda_bf16_sm90@sm90 --expect cuda_bf16@sm86-proxy} ;;
    # the generic module alone for sm_90 (build/cuda-tiled), then the tensor-core attention forward's GPU tests, the
    # cuda_bf16 attention cells on every tier and its bench rows against SDPA, in one step and one log
    tiled)  tb="$PWD/build/cuda-tiled"
            step tiled "${TILED_LIMIT:-330}" bash -c "set -x; TORCH_CUDA_ARCH_LIST=9.0 WS1_MODULES=generic MAX_JOBS=8 \
              python3 csrc/setup.py build_ext --build-lib $tb --build-temp $tb/tmp > $OUT/tiled-build.txt 2>&1 \
              || { tail -40 $OUT/tiled-build.txt; exit 2; }; export PYTHONPATH=$tb:\${PYTHONPATH:-}; \
              python3 -m pytest -q -p no:cacheprovider -rfE tests/ws1_kernels/test_cuda_attention_tiled_gpu.py \
                tests/ws1_kernels/test_cuda_ops_gpu.py; \
              ws1 matrix --profile cuda_bf16 --op attention ${tiers[*]} --cell-timeout 120 --out $ev/cuda_tiled --force; \
              ws1 bench --profile cuda_bf16 --op attention --m 4096 --m 16384 --out $ev/bench-tiled --force; \
              ws1 bench --profile cuda_bf16 --op attention_decode --m 1 --m 64 --out $ev/bench-tiled-decode --force" ;;
    # the Hopper attention forward (needs hopper-build's modules): its GPU tests and the step path's, the
    # cuda_bf16_sm90 attention cells on every tier, its bench rows against SDPA (prefill at 4096-16384 tokens, decode
    # at batch 1, 64 and 256 over 4096 cached keys), every schedule and CTA shape timed beside SDPA
    # (ci/attn_sm90_variants.py), ncu of the wired variant at 16384 tokens (ATTN90_NCU_VARIANT; for the backward's
    # kernels ATTN90_NCU_BACKWARD=--backward ATTN90_NCU_KERNELS='ws1_sm90_attn_bwd_d[qkv]' ATTN90_NCU_COUNT=2, or 3 with FUSE_DKV
    # off), then
    # memcheck and racecheck over ci/sanitize_attn_sm90.py
    attn90) hb="$PWD/build/cuda-gpu_sm90"; hp="$hb:$hb/hopper:${PYTHONPATH:-}"
            step attn90-tests "${ATTN90_TESTS_LIMIT:-200}" env PYTHONPATH="$hp" python3 -m pytest -q -p no:cacheprovider \
              -rfE --durations=15 tests/ws1_kernels/test_cuda_sm90_attention_gpu.py \
              tests/ws1_kernels/test_cuda_sm90_attention_bwd_gpu.py tests/ws1_kernels/test_cuda_sm90_step_gpu.py \
              tests/ws1_kernels/test_cuda_sm90_attention_wide_gpu.py tests/ws1_kernels/test_cuda_sm90_attention_pingpong_gpu.py
            step attn90-cells "${ATTN90_CELLS_LIMIT:-200}" env PYTHONPATH="$hp" ws1 matrix --profile cuda_bf16_sm90 \
              --op attention "${tiers[@]}" --cell-timeout 120 --out "$ev/sm90_attention" --force
            step attn90-bench "${ATTN90_BENCH_LIMIT:-200}" env PYTHONPATH="$hp" bash -c "ws1 bench --profile cuda_bf16_sm90 \
              --op attention --m 4096 --m 8192 --m 16384 --out $ev/bench-attn90 --force; ws1 bench --profile \
              cuda_bf16_sm90 --op attention_decode --m 1 --m 64 --m 256 --out $ev/bench-attn90-decode --force"
            step attn90-variants "${ATTN90_VARIANTS_LIMIT:-120}" env PYTHONPATH="$hp" python3 ci/attn_sm90_variants.py \
              --tokens 4096 --tokens 8192 --tokens 16384 --seq 4096 --backward --out "$ev/attn90-variants.json"
            step attn90-ncu "${NCU_LIMIT:-90}" env PYTHONPATH="$hp" ncu --clock-control none --section SpeedOfLight \
              --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
              -k "regex:${ATTN90_NCU_KERNELS:-ws1_sm90_attn_fwd}" --launch-skip "${ATTN90_NCU_SKIP:-3}" \
              --launch-count "${ATTN90_NCU_COUNT:-1}" python3 ci/attn_sm90_variants.py --variant \
              "${ATTN90_NCU_VARIANT:-64:1}" --tokens 16384 --reps 2 --warmup 2 "${ATTN90_NCU_BACKWARD:---no-sdpa}" \
              --out "$ev/attn90-ncu-variant.json"
            for tool in memcheck racecheck; do
              step "attn90-$tool" "${HOPPER_SANITIZE_LIMIT:-120}" env PYTHONPATH="$hp" compute-sanitizer --tool "$tool" \
                --error-exitcode 1 python3 ci/sanitize_attn_sm90.py
            done ;;
    # compute-sanitizer's memcheck and racecheck over the Hopper attention alone (every forward schedule, the
    # backward in both fuse modes), for a short call (needs hopper-build's modules)
    attn90-san) hb="$PWD/build/cuda-gpu_sm90"; hp="$hb:$hb/hopper:${PYTHONPATH:-}"
            for tool in memcheck racecheck; do
              step "attn90-$tool" "${HOPPER_SANITIZE_LIMIT:-120}" env PYTHONPATH="$hp" compute-sanitizer --tool "$tool" \
                --error-exitcode 1 python3 ci/sanitize_attn_sm90.py
            done ;;
    # the Hopper attention backward alone, for a short call (needs hopper-build's modules): its GPU tests with the
    # Hopper module's sm90a check, then the backward timed beside SDPA's and the generic one at 8192 and 16384 tokens
    attn90-bwd) hb="$PWD/build/cuda-gpu_sm90"; hp="$hb:$hb/hopper:${PYTHONPATH:-}"
            step attn90-bwd-tests "${ATTN90_TESTS_LIMIT:-120}" env PYTHONPATH="$hp" python3 -m pytest -q \
              -p no:cacheprovider -rfE tests/ws1_kernels/test_cuda_sm90_attention_bwd_gpu.py \
              tests/ws1_kernels/test_cuda_sm90_gpu.py::test_the_kernels_are_sm90a_machine_code
            step attn90-bwd-time "${ATTN90_VARIANTS_LIMIT:-90}" env PYTHONPATH="$hp" python3 ci/attn_sm90_variants.py \
              --variant 64:1 --tokens 8192 --tokens 16384 --seq 4096 --backward --out "$ev/attn90-bwd.json" ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
tar czf "$OUT/evidence.tgz" -C "$OUT" ev 2>/dev/null
ls -la "$OUT"
