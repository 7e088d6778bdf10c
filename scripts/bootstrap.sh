#!/usr/bin/env bash
# Shared set-up for scripts/demo and scripts/test, sourced by both: on a fresh Debian or Ubuntu
# machine it installs redis-server, makes .venv and installs draftgen, with the extras the sourcing
# script sets in BOOTSTRAP_EXTRAS ("test" for scripts/test; none for the demo, which runs draftgen only).
# Re-running is cheap: the install is redone only when pyproject.toml changes.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
EXTRAS="${BOOTSTRAP_EXTRAS:-}"
STAMP_PREFIX="$VENV/.installed-"  # + the extras installed ("base" for none), holding that pyproject.toml

need_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: $* missing and this is not a Debian/Ubuntu machine: install it, then re-run" >&2
    exit 1
  fi
  need_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive need_root apt-get install -y -qq "$@" >/dev/null
}

pick_python() {
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"; return
    fi
  done
  echo "error: draftgen needs Python 3.11 or newer (with venv)" >&2
  exit 1
}

command -v redis-server >/dev/null 2>&1 || apt_install redis-server
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then apt_install python3-venv; fi

if [ ! -x "$VENV/bin/python" ]; then
  "$(pick_python)" -m venv "$VENV"
fi
stamped() { [ -f "${STAMP_PREFIX}$1" ] && cmp -s "$ROOT/pyproject.toml" "${STAMP_PREFIX}$1"; }
installed() {  # whether .venv holds this pyproject.toml's draftgen with extras $1 (the test extras hold base)
  stamped "${1:-base}" || { [ -z "$1" ] && stamped test; }
}
if ! installed "$EXTRAS"; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  cp "$ROOT/pyproject.toml" "${STAMP_PREFIX}${EXTRAS:-base}"
fi
export PATH="$VENV/bin:$PATH"
