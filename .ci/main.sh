#!/usr/bin/env bash
# The README's main job: installs what is missing, builds, and runs the
# statecache demo on the CPU backend: a child statecached serves a multi-turn
# workload of the shipped gdn-tiny model with calibrated DAMP states, compared
# with FP32 states (memory, prefix-cache hits, update latency, accuracy).
# Extra arguments go to `statecachectl demo` (see `demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
bazel build //client/ctl:statecachectl //server:statecached
exec bazel-bin/client/ctl/statecachectl demo "$@"
