#!/bin/sh
# A BusyBox-only image (no bash, no coreutils, no Python), built without a registry from Debian's
# busybox-static: the sandbox probe and the file tools must work on such images (Alpine-like).
set -eu
IMAGE="${1:-hermes-batch-busybox:test}"
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "$IMAGE already built"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
apt-get download busybox-static >/dev/null 2>&1 || { apt-get update -qq && apt-get download busybox-static; }
dpkg-deb -x busybox-static_*.deb root
mkdir -p root/usr/bin root/sbin root/usr/sbin root/tmp root/etc root/workspace
for applet in $(root/bin/busybox --list); do
  [ -e "root/bin/$applet" ] || ln -s busybox "root/bin/$applet"
done
echo 'root:x:0:0:root:/root:/bin/sh' > root/etc/passwd
echo 'root:x:0:' > root/etc/group
tar -C root -c . | docker import -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin' - "$IMAGE" >/dev/null
echo "built $IMAGE"
