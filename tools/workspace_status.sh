#!/bin/sh
# Bazel workspace status (--workspace_status_command in .bazelrc): the git
# revision of the checkout, as a stable key so that only the targets reading
# it (//tools/build_info, linked into the release binaries) are rebuilt when
# it changes. Outside a git checkout the revision is "unknown".
rev="$(git rev-parse HEAD 2>/dev/null)"
echo "STABLE_STATECACHE_GIT_REVISION ${rev:-unknown}"
