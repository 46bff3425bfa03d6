#!/usr/bin/env bash
# Builds a ThreadSanitizer-instrumented copy of Debian's Abseil shared
# libraries (the exact Debian source package, patches applied) into
# /opt/statecache/absl-tsan/lib, for `bazel test --config=tsan` only.
#
# Why: Debian's libabsl_synchronization is not built with -fsanitize=thread,
# so absl::Mutex's TSan annotations are compiled out and TSan sees no
# happens-before edge through Mutex/CondVar: every guarded access looks like
# a race (false reports). Same SONAMEs (libabsl_*.so.20220623), so
# LD_LIBRARY_PATH (set by .bazelrc's test:tsan) makes the test binaries load
# these instead; the headers and link-time libraries stay Debian's.
#
# Needs: Debian's source archive (deb-src, configured only for this script in
# a private sources list), cmake, ninja, g++. About 5 minutes on 2 cores.
#   bash third_party/system/absl_tsan/build_absl_tsan.sh
set -euo pipefail
PREFIX=${PREFIX:-/opt/statecache/absl-tsan}
WORK=${WORK:-/tmp/statecache-absl-tsan}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$WORK/lists/partial" "$WORK/src-pkg" "$PREFIX/lib"
echo "deb-src http://deb.debian.org/debian bookworm main" > "$WORK/sources.list"
APT=(-o "Dir::Etc::sourcelist=$WORK/sources.list" -o "Dir::Etc::sourceparts=-"
     -o "Dir::State::Lists=$WORK/lists")
version=$(dpkg-query -W -f='${source:Version}' libabsl20220623)
apt-get "${APT[@]}" update -q
(cd "$WORK/src-pkg" && apt-get "${APT[@]}" source --download-only "abseil=$version")
rm -rf "$WORK/src" && dpkg-source -x "$WORK"/src-pkg/abseil_*.dsc "$WORK/src"
cmake -S "$WORK/src" -B "$WORK/build" -G Ninja -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="-fsanitize=thread"
ninja -C "$WORK/build" -j"$(nproc)" synchronization
cp -a "$WORK"/build/absl/*/libabsl_*.so* "$PREFIX/lib/"
cp "$here/tsan.supp" "$PREFIX/tsan.supp"
echo "absl-tsan: $(ls "$PREFIX"/lib/*.so.* | wc -l) libraries in $PREFIX/lib"
