#!/bin/sh
# The runtime spike's newer runtimes (issue 31): runc and crun from Debian sid, which bookworm
# does not carry (not even in backports), made runnable on bookworm without installing them.
# Both need glibc >= 2.38 (bookworm has 2.36): sid's libc6 is unpacked beside them and each
# binary's interpreter and library path point at it (patchelf); their other libraries
# (libseccomp, libsystemd, libcap, json-c) are bookworm's. Nothing is installed system-wide but
# patchelf. A spike's tool, not a way to ship: see docs/isolation.md, "Runtime choice".
#
# Usage (root): spikes/fetch-newer-runtimes.sh [TARGET_DIR]   (default target/runtimes)
# Leaves TARGET_DIR/runc-<version>, TARGET_DIR/crun-<version> and TARGET_DIR/lib/.
set -eu
RUNC=1.3.6+ds1-1
CRUN=1.28-1
LIBC=2.43-7
BLAKE3=1.8.2-1
out=$(realpath -m "${1:-target/runtimes}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/parts" "$work/lists/partial" "$work/cache/archives/partial" "$out/lib"
cat >"$work/parts/sid.sources" <<EOF
Types: deb
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
: >"$work/none.list"
apt_opts="-o Dir::Etc::SourceList=$work/none.list -o Dir::Etc::SourceParts=$work/parts
 -o Dir::State::Lists=$work/lists -o Dir::Cache=$work/cache -o APT::Sandbox::User=root"
command -v patchelf >/dev/null || apt-get install -y patchelf
# shellcheck disable=SC2086
apt-get $apt_opts update
cd "$work"
# shellcheck disable=SC2086
apt-get $apt_opts download "runc=$RUNC" "crun=$CRUN" "libc6=$LIBC" "libblake3-0=$BLAKE3"
for deb in ./*.deb; do dpkg-deb -x "$deb" x; done
cp -a x/usr/lib/x86_64-linux-gnu/. "$out/lib/"
runc="$out/runc-${RUNC%%+*}"
crun="$out/crun-${CRUN%%-*}"
cp x/usr/sbin/runc "$runc"
cp x/usr/bin/crun "$crun"
for b in "$runc" "$crun"; do
    patchelf --set-interpreter "$out/lib/ld-linux-x86-64.so.2" --set-rpath "$out/lib" "$b"
    "$b" --version | head -1
done
