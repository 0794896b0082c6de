#!/bin/sh
# The MCP test servers' Python packages (the mcp SDK, and a published server: mcp-server-time), from
# PyPI, installed once where the local jail sees them (it binds this machine's /usr read-only), and an
# image of the sandbox image holding them at the same path. Idempotent.
set -eu
SITE=${HERMES_BATCH_MCP_SITE:-/usr/local/lib/hermes-batch-mcp}
IMG=${HERMES_BATCH_MCP_IMAGE:-hermes-batch-mcp:test}
BASE=${HERMES_BATCH_TEST_IMAGE:-hermes-batch-sandbox:bookworm}
PY=${PYTHON:-python3}  # a Python 3.11 with pip, as the jail's /usr/bin/python3 and the image's are
if [ ! -f "$SITE/.complete" ]; then
  rm -rf "$SITE.partial"
  "$PY" -m pip install -q --disable-pip-version-check --target "$SITE.partial" "mcp==1.30.0" "mcp-server-time==2026.8.18"
  touch "$SITE.partial/.complete"
  rm -rf "$SITE" && mv "$SITE.partial" "$SITE"
fi
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 && ! docker image inspect "$IMG" >/dev/null 2>&1; then
  ctx=$(mktemp -d)
  cp -a "$SITE" "$ctx/site"
  printf 'FROM %s\nCOPY site %s\n' "$BASE" "$SITE" > "$ctx/Dockerfile"
  docker build -q -t "$IMG" "$ctx" >/dev/null
  rm -rf "$ctx"
fi
echo "MCP test site: $SITE"
