#!/bin/sh
# Tuneplane node installer, served by the console at {{ server }}/install.sh
#   curl -fsSL {{ server }}/install.sh | TUNEPLANE_FLEET=<fleet> TUNEPLANE_JOIN_TOKEN=<token> \
#     TUNEPLANE_AGENT_SHA256=<digest> sh
# The digest, shown with the one-liner, is of the agent's lock (every wheel with its SHA-256):
# nothing is installed unless the lock matches it and every wheel matches the lock.
# Optional: TUNEPLANE_STORAGE_ROOT, TUNEPLANE_CPU_BUDGET, TUNEPLANE_MEMORY_BUDGET_BYTES,
# TUNEPLANE_NODE_STATE_DIR, TUNEPLANE_INVENTORY_FILE, TUNEPLANE_PREFIX (install under a
# directory instead of /), TUNEPLANE_PYTHON (default python3).
set -eu

SERVER="{{ server }}"
: "${TUNEPLANE_FLEET:?set TUNEPLANE_FLEET to the Fleet id shown by Add a machine}"
: "${TUNEPLANE_JOIN_TOKEN:?set TUNEPLANE_JOIN_TOKEN to the join token shown by Add a machine}"
: "${TUNEPLANE_AGENT_SHA256:?set TUNEPLANE_AGENT_SHA256 to the digest in the one-liner shown by Add a machine}"
PREFIX="${TUNEPLANE_PREFIX:-}"
PYTHON="${TUNEPLANE_PYTHON:-python3}"
VENV="$PREFIX/opt/tuneplane-node"
STATE_DIR="${TUNEPLANE_NODE_STATE_DIR:-$PREFIX/var/lib/tuneplane-node}"
CONF_DIR="$PREFIX/etc/tuneplane-node"
UNIT_DIR="$PREFIX/etc/systemd/system"
STORAGE_ROOT="${TUNEPLANE_STORAGE_ROOT:-}"
CPU_BUDGET="${TUNEPLANE_CPU_BUDGET:-}"
MEMORY_BUDGET_BYTES="${TUNEPLANE_MEMORY_BUDGET_BYTES:-}"

say() { printf 'tuneplane: %s\n' "$*"; }

command -v "$PYTHON" >/dev/null 2>&1 || { say "needs $PYTHON (3.10 or newer, with venv)"; exit 1; }

LOCK=$(mktemp)
trap 'rm -f "$LOCK"' EXIT
"$PYTHON" - "$SERVER/downloads/tuneplane-node.lock" "$LOCK" "$TUNEPLANE_AGENT_SHA256" <<'CHECK' || exit 1
import hashlib, sys, urllib.request
url, path, expected = sys.argv[1:]
data = urllib.request.urlopen(url, timeout=60).read()
if hashlib.sha256(data).hexdigest() != expected.strip().lower():
    sys.exit("tuneplane: the agent's lock at " + url + " does not match TUNEPLANE_AGENT_SHA256; nothing installed")
open(path, "wb").write(data)
CHECK

say "installing the node agent into $VENV (from $SERVER/downloads/, no other index, every wheel's SHA-256 checked)"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-index \
  --require-hashes --find-links "$SERVER/downloads/" -r "$LOCK"

set -- --server "$SERVER" --fleet "$TUNEPLANE_FLEET"
if [ -n "${TUNEPLANE_INVENTORY_FILE:-}" ]; then set -- "$@" --inventory-file "$TUNEPLANE_INVENTORY_FILE"; fi
if [ -n "$STORAGE_ROOT" ]; then set -- "$@" --storage-root "$STORAGE_ROOT"; fi
if [ -n "$CPU_BUDGET" ]; then set -- "$@" --cpu-budget "$CPU_BUDGET"; fi
if [ -n "$MEMORY_BUDGET_BYTES" ]; then set -- "$@" --memory-budget-bytes "$MEMORY_BUDGET_BYTES"; fi

say "joining fleet $TUNEPLANE_FLEET"
# The token reaches the agent through its environment, never a command line others can read.
TUNEPLANE_JOIN_TOKEN="$TUNEPLANE_JOIN_TOKEN" "$VENV/bin/tuneplane-node" --state-dir "$STATE_DIR" join "$@"

GATEWAY=$("$VENV/bin/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["gateway_target"])' "$STATE_DIR/node.json")

mkdir -p "$CONF_DIR" "$UNIT_DIR"
cat > "$CONF_DIR/node.env" <<CONF
# Read by tuneplane-node serve. Check each line before starting the service.
TUNEPLANE_NODE_STATE_DIR=$STATE_DIR
TUNEPLANE_STORAGE_ROOT=$STORAGE_ROOT
TUNEPLANE_CPU_BUDGET=$CPU_BUDGET
TUNEPLANE_MEMORY_BUDGET_BYTES=$MEMORY_BUDGET_BYTES
TUNEPLANE_GATEWAY_TARGET=$GATEWAY
TUNEPLANE_CA_BUNDLE=$STATE_DIR/ca.pem
CONF

cat > "$UNIT_DIR/tuneplane-node.service" <<UNIT
[Unit]
Description=Tuneplane node agent (control stream to $GATEWAY)
After=network-online.target
Wants=network-online.target

[Service]
EnvironmentFile=$CONF_DIR/node.env
ExecStart=$VENV/bin/tuneplane-node --state-dir $STATE_DIR serve --target $GATEWAY
Restart=always
RestartSec=5
# Exit 3: the console refused this node for good (removed, its credential dead): the agent
# said how to join again, and starting it again cannot help.
RestartPreventExitStatus=3
# A restart or upgrade of the agent takes no job with it (R6): only the agent is stopped;
# its members run in sessions and cgroups of their own and the new agent re-adopts them.
KillMode=process

[Install]
WantedBy=multi-user.target
UNIT

say "installed; the service is NOT started. Enrollment alone does not make this node ready."
say "next: check $CONF_DIR/node.env (storage root, CPU and memory budgets, gateway, CA bundle),"
say "then: systemctl daemon-reload && systemctl enable --now tuneplane-node"
say "the node shows as enrolled until the service connects and reports its inventory."
