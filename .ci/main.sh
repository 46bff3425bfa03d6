#!/usr/bin/env bash
# The README's main job: installs what is missing, builds, and runs the
# statecache format report on the CPU backend (storage table of every format,
# then recorded and SYNTHETIC decode trajectories replayed through each).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
bazel build //kernels/eval:format_report_main
exec bazel-bin/kernels/eval/format_report_main --backend=cpu "$@"
