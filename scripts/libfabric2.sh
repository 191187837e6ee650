#!/usr/bin/env bash
# Builds libfabric 2.1 from Debian 13 (trixie)'s source package into PREFIX,
# with the efa provider compiled in (it needs infiniband/efadv.h from
# libibverbs-dev), so that fitransfer can be built and tested against 2.x
# as well as Debian 12's 1.17: `make test LIBFABRIC=2`.
#
# A previous build in PREFIX is reused. Debian serves the orig tarball but
# not always the .dsc, so the tarball is fetched with
# `apt-get source --download-only` (whose .dsc failure is ignored) and
# checked against the SHA-256 in the source index before it is built.
set -euo pipefail

prefix=${1:?usage: libfabric2.sh PREFIX}
version=2.1.0
sudo=; [ "$(id -u)" = 0 ] || sudo=sudo

if [ -f "$prefix/lib/pkgconfig/libfabric.pc" ] &&
	[ "$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --modversion libfabric)" = "$version" ]; then
	echo "libfabric $version already built in $prefix"
	exit 0
fi

list=/etc/apt/sources.list.d/fitransfer-trixie-src.sources
if [ ! -f "$list" ]; then
	$sudo tee "$list" >/dev/null <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq autoconf automake libtool make gcc libibverbs-dev >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
tarball=libfabric_${version}.orig.tar.xz
apt-get source --download-only "libfabric=${version}-1.1" >/dev/null 2>&1 || true
[ -f "$tarball" ] || { echo "libfabric2: $tarball was not downloaded (is trixie's deb-src reachable?)" >&2; exit 1; }
want=$(apt-cache showsrc libfabric | awk -v f="$tarball" '/^Checksums-Sha256:/ {c=1; next} /^[^ ]/ {c=0} c && $3 == f {print $1; exit}')
got=$(sha256sum "$tarball" | cut -d' ' -f1)
if [ -z "$want" ] || [ "$want" != "$got" ]; then
	echo "libfabric2: SHA-256 of $tarball is $got, the source index says '${want:-nothing}': not building it" >&2
	exit 1
fi
echo "libfabric2: $tarball verified ($got)"

tar -xf "$tarball"
cd "libfabric-$version"
[ -x configure ] || ./autogen.sh >/dev/null
./configure --prefix="$prefix" --disable-static >configure.log 2>&1 || { tail -n 30 configure.log; exit 1; }
make -j"$(nproc)" >make.log 2>&1 || { tail -n 30 make.log; exit 1; }
$sudo make install >/dev/null
echo "libfabric2: built $version into $prefix; providers: $(grep -E '^\*\*\*.*(yes|dl)' configure.log | awk '{print $2}' | tr '\n' ' ')"
