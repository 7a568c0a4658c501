#!/usr/bin/env bash
# Refuse to build or run unless the GPU has the compute capability this shard is for; a proxy shard may name the
# other capability it runs on (the sm86 session on an sm_90 card runs 8.6+PTX through the driver's JIT and labels
# its evidence a proxy). Exit 2 with one line otherwise.
#   bash ci/assert_gpu_arch.sh 9.0
#   bash ci/assert_gpu_arch.sh 8.6 --proxy-on 9.0
set -u
want=${1:-}
proxy=""
if [ -z "$want" ]; then echo "assert_gpu_arch: name the capability, e.g. 9.0" >&2; exit 2; fi
if [ "${2:-}" = "--proxy-on" ]; then
  proxy=${3:-}
  if [ -z "$proxy" ]; then echo "assert_gpu_arch: --proxy-on needs a capability" >&2; exit 2; fi
fi
cap=$(python3 -c "import sys, torch
if not torch.cuda.is_available(): sys.exit(3)
p = torch.cuda.get_device_capability(); print(f'{p[0]}.{p[1]}')" 2>/dev/null)
rc=$?
if [ $rc -ne 0 ]; then echo "assert_gpu_arch: torch is missing or sees no CUDA device (probe exit $rc): refusing to run" >&2; exit 2; fi
echo "device capability $cap"
if [ "$cap" = "$want" ]; then exit 0; fi
if [ -n "$proxy" ] && [ "$cap" = "$proxy" ]; then
  echo "capability $cap: a PTX proxy run for $want, labelled so in its evidence"
  exit 0
fi
echo "assert_gpu_arch: expected capability $want${proxy:+ (or $proxy as a proxy)}, found $cap: refusing to run" >&2
exit 2
