#!/usr/bin/env bash
# Build the stgtrace Valgrind tool out of tree against Debian's packaged
# Valgrind (the valgrind package ships the tool headers in /usr/include/valgrind
# and libcoregrind/libvex archives in /usr/lib/x86_64-linux-gnu/valgrind).
# Prints the directory to use as VALGRIND_LIB (the tool next to symlinks to
# Valgrind's own support files).  Rebuilds only when st_main.c changed.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="$ROOT/target/capture-build"
VGLIB="$BUILD/vglib"
VGARCH=/usr/lib/x86_64-linux-gnu/valgrind
SRC="$HERE/st_main.c"
mkdir -p "$BUILD"
if [ ! -x "$VGLIB/stgtrace-amd64-linux" ] || [ "$SRC" -nt "$VGLIB/stgtrace-amd64-linux" ]; then
  for f in /usr/include/valgrind/pub_tool_tooliface.h "$VGARCH/libcoregrind-amd64-linux.a"; do
    [ -e "$f" ] || { echo "build_tool.sh: $f missing (apt-get install valgrind)" >&2; exit 1; }
  done
  gcc -m64 -O2 -g -Wall -Wno-unused-function -fno-strict-aliasing -fno-builtin \
      -fno-stack-protector -fno-pie \
      -DVGA_amd64=1 -DVGO_linux=1 -DVGP_amd64_linux=1 -DVGPV_amd64_linux_vanilla=1 \
      -I/usr/include/valgrind -c "$SRC" -o "$BUILD/st_main.o" >&2
  # link like Valgrind's Makefile.tool.am: static, no libc, at valt_load_address
  gcc -m64 -o "$BUILD/stgtrace-amd64-linux" "$BUILD/st_main.o" -static -nodefaultlibs \
      -nostartfiles -u _start -no-pie -Wl,--build-id=none -Wl,-Ttext-segment=0x58000000 \
      "$VGARCH/libcoregrind-amd64-linux.a" "$VGARCH/libvex-amd64-linux.a" -lgcc >&2
  rm -rf "$VGLIB"; mkdir -p "$VGLIB"
  for f in /usr/libexec/valgrind/*; do ln -s "$f" "$VGLIB/"; done
  cp "$BUILD/stgtrace-amd64-linux" "$VGLIB/"
fi
echo "$VGLIB"
