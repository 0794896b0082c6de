#!/bin/sh
# Make a real Apptainer usable on Debian 12 (whose archive has none), idempotently:
#   1. build a Debian sid root filesystem holding apptainer (it needs glibc 2.38) with mmdebstrap;
#   2. install /usr/local/bin/apptainer, a wrapper running it there through bubblewrap
#      (apptainer refuses a chroot; it needs / to be a mount point);
#   3. build the test image as a SIF from the Docker test image (scripts/build_sandbox_image.sh).
# Only /tmp and /var/tmp of the host are visible to this apptainer: keep images and sandboxes there.
set -eu
ROOT=${HERMES_BATCH_APPTAINER_ROOT:-/opt/hermes-batch-apptainer/rootfs}
SIF=${HERMES_BATCH_TEST_SIF:-/var/tmp/hermes-batch-images/sandbox.sif}
IMG=${HERMES_BATCH_TEST_IMAGE:-hermes-batch-sandbox:bookworm}

need=""
command -v bwrap >/dev/null || need="$need bubblewrap"
command -v mmdebstrap >/dev/null || need="$need mmdebstrap"
if [ -n "$need" ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
fi

if [ ! -x "$ROOT/usr/bin/apptainer" ]; then
  mkdir -p "$(dirname "$ROOT")"
  URI=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$URI" ] || URI=http://deb.debian.org/debian
  # the mirror serves a frozen snapshot whose sid Release file is "expired" by the machine's clock
  mmdebstrap --quiet --variant=essential --include=apptainer,ca-certificates \
    --aptopt='Acquire::Check-Valid-Until "false"' --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    sid "$ROOT.partial" "deb $URI sid main" </dev/null
  # root here lacks CAP_SYS_RESOURCE, and there is no systemd to manage cgroups
  sed -i -e 's/^root default capabilities = .*/root default capabilities = file/' \
         -e 's/^systemd cgroups = .*/systemd cgroups = no/' "$ROOT.partial/etc/apptainer/apptainer.conf"
  rm -rf "$ROOT" && mv "$ROOT.partial" "$ROOT"
fi

if ! command -v apptainer >/dev/null 2>&1; then
  cat > /usr/local/bin/apptainer <<WRAP
#!/bin/sh
exec bwrap --bind "$ROOT" / --dev-bind /dev /dev --proc /proc --bind /sys /sys --bind /tmp /tmp \\
  --bind /var/tmp /var/tmp --ro-bind /etc/hosts /etc/hosts --ro-bind /etc/resolv.conf /etc/resolv.conf \\
  --ro-bind /etc/localtime /etc/localtime --cap-add ALL --chdir / /usr/bin/apptainer "\$@"
WRAP
  chmod +x /usr/local/bin/apptainer
fi
apptainer --version

if [ ! -f "$SIF" ]; then
  mkdir -p "$(dirname "$SIF")"
  docker image inspect "$IMG" >/dev/null 2>&1 || sh "$(dirname "$0")/build_sandbox_image.sh" "$IMG"
  docker save "$IMG" -o "$SIF.tar"
  apptainer build --force "$SIF.partial" "docker-archive://$SIF.tar" >/dev/null
  rm -f "$SIF.tar" && mv "$SIF.partial" "$SIF"
fi
echo "test SIF: $SIF"
