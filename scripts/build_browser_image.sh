#!/bin/sh
# The sandbox image with a browser and a voice: Debian + Python 3 + Chromium + espeak-ng, built
# without any registry (mmdebstrap → docker import), for the browser and tts toolsets on docker.
# Idempotent: exits at once when the image is present with both (an older one without espeak-ng is
# built again).  Usage: scripts/build_browser_image.sh [tag]
set -eu
IMG=${1:-${HERMES_BATCH_BROWSER_IMAGE:-hermes-batch-browser:bookworm}}
DOCKER=${DOCKER:-docker}
if $DOCKER image inspect "$IMG" >/dev/null 2>&1 \
   && $DOCKER run --rm --network=none "$IMG" sh -c 'command -v chromium && command -v espeak-ng' >/dev/null 2>&1; then
  echo "image $IMG already present"; exit 0
fi
if ! command -v mmdebstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi
SRC=/etc/apt/sources.list.d/debian.sources; [ -f "$SRC" ] || SRC=/etc/apt/sources.list
mmdebstrap --quiet --variant=essential --include=python3,ca-certificates,chromium,fonts-dejavu-core,espeak-ng \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --aptopt='APT::Install-Recommends "false"' --aptopt='Acquire::Languages "none"' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/info/*' \
  bookworm - "$SRC" </dev/null 2>/dev/null \
| $DOCKER import -c 'CMD ["python3"]' -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$IMG" >/dev/null
$DOCKER run --rm --network=none "$IMG" sh -c 'chromium --version && espeak-ng --version' 
