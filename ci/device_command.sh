#!/usr/bin/env bash
# Print the command line of one device call that runs this checkout's HEAD in place (ci/device_session.sh with
# SOURCE_COMMIT and SOURCE_TREE), for the device tool's `run`: the commit and its tree come from git here, never
# typed. Why: on 2026-12-07 a hand-typed full-length SOURCE_COMMIT named no commit; the tree check passed (the files
# were right) and the harness recorded the wrong value in the evidence.
#   bash ci/device_command.sh MODE_H200=merged MODE_H100=merged-80g MERGED_CPU=out/cpu-<sha>
# Arguments are NAME=VALUE settings put before device_session.sh (the modes, MERGED_CPU, limits). Refused with one
# line and exit 2: a dirty tree (the device would get files that are no commit), no MODE_ setting, or an argument
# that is not NAME=VALUE. The call's output comes back packed in one archive ($OUT/all.tgz: the tool returns at
# most 8 files).
set -u
cd "$(dirname "$0")/.." || exit 2
[ -z "$(git status --porcelain 2>&1)" ] || {
  echo "device_command: the checkout has uncommitted changes: commit them first (the call runs a commit's files)"
  exit 2
}
mode=0
for a in "$@"; do
  [[ "$a" =~ ^[A-Z][A-Z0-9_]*=[^[:space:]\'\"\;\&\|]*$ ]] || {
    echo "device_command: $a is not NAME=VALUE (no spaces, quotes or shell operators)"
    exit 2
  }
  [[ "$a" == MODE_* ]] && mode=1
done
[ "$mode" = 1 ] || { echo "device_command: give the mode for each card, e.g. MODE_H200=merged MODE_H100=merged-80g"; exit 2; }
if ! commit=$(git rev-parse HEAD) || ! tree=$(git rev-parse 'HEAD^{tree}'); then
  echo "device_command: git rev-parse failed"
  exit 2
fi
# the $ in the printed command are the device's, expanded there (single quotes on purpose)
# shellcheck disable=SC2016
wheels='python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site'
# shellcheck disable=SC2016
wheels+=' .whl/*.whl && export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH || exit;'
# shellcheck disable=SC2016
echo "$wheels export PYTHONUNBUFFERED=1; SOURCE_COMMIT=$commit SOURCE_TREE=$tree $* bash ci/device_session.sh" \
  '> $OUT/session.log 2>&1; echo session rc=$?; cat $OUT/steps.txt; cd $OUT && tar czf /tmp/all.tgz . &&' \
  'rm -rf ./* && mv /tmp/all.tgz .'
