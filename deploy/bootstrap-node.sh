#!/usr/bin/env bash
# Turn a fresh Debian/Ubuntu GPU node into a draftgen node: a venv with draftgen[gpu] (SGLang),
# the model staged into /dev/shm, and one SGLang server plus one generate worker per GPU under
# systemd. Idempotent: re-running updates the code and the units and skips what is already done.
#
#   sudo deploy/bootstrap-node.sh [--gpus N] [--uploader] [--flower] [--env-file FILE] [--redis-env FILE]
#        [--restart] [--dry-run]
#
#   --gpus N         GPUs to serve (default: as many as `nvidia-smi -L` lists)
#   --uploader       also run the uploader on this node (one per run is enough)
#   --flower         also run Flower on this node (usually the head node)
#   --env-file FILE  install FILE as /etc/draftgen/draftgen.env (default: keep the existing one,
#                    or start from deploy/draftgen.env.example and stop so you can edit it)
#   --redis-env FILE this node's own Redis env file, redis-worker-<host>.env from the head node
#                    (deploy/multi-node.md, section 1): installed as /etc/draftgen/redis-worker-<host>.env
#                    for its generate workers; refused when it holds another host's user
#   --prefix DIR     where draftgen lives (default /opt/draftgen; the units expect that path)
#   --restart        restart units that are already running, to pick up new code or settings
#                    (without it, running servers and workers are left alone)
#   --dry-run        print every command that changes something, run none of them
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX=/opt/draftgen
ENV_DIR=/etc/draftgen
ENV_FILE="$ENV_DIR/draftgen.env"
UNIT_DIR=/etc/systemd/system
SERVICE_USER=draftgen
GPUS=""
WITH_UPLOADER=0
WITH_FLOWER=0
NEW_ENV_FILE=""
NEW_REDIS_ENV_FILE=""
NODE_HOST="$(hostname)"  # systemd's %H: the host of this node's worker labels and of its Redis user
NODE_REDIS_ENV_FILE="$ENV_DIR/redis-worker-$NODE_HOST.env"
RESTART=0
DRY_RUN=0

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) GPUS="${2:?--gpus needs a number}"; shift 2 ;;
    --uploader) WITH_UPLOADER=1; shift ;;
    --flower) WITH_FLOWER=1; shift ;;
    --env-file) NEW_ENV_FILE="${2:?--env-file needs a path}"; shift 2 ;;
    --redis-env) NEW_REDIS_ENV_FILE="${2:?--redis-env needs a path}"; shift 2 ;;
    --prefix) PREFIX="${2:?--prefix needs a folder}"; shift 2 ;;
    --restart) RESTART=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

# Every command that changes the machine goes through `run`, so --dry-run shows them all.
run() {
  if [ "$DRY_RUN" -eq 1 ]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

step() { printf '\n== %s\n' "$*"; }

if [ "$DRY_RUN" -eq 0 ] && [ "$(id -u)" -ne 0 ]; then
  echo "error: run as root (sudo $0 $*), or add --dry-run to see what it would do" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: this script is for Debian/Ubuntu (apt-get not found)" >&2
  exit 1
fi

if [ -z "$GPUS" ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "error: nvidia-smi not found: install the NVIDIA driver first, or pass --gpus N" >&2
    exit 1
  fi
  GPUS="$(nvidia-smi -L | grep -c '^GPU ')"
fi
case "$GPUS" in
  ''|*[!0-9]*|0) echo "error: --gpus must be a whole number of 1 or more, not '$GPUS'" >&2; exit 2 ;;
esac
if [ -n "$NEW_REDIS_ENV_FILE" ] && [ ! -r "$NEW_REDIS_ENV_FILE" ]; then
  echo "error: --redis-env $NEW_REDIS_ENV_FILE: no such readable file" >&2
  exit 2
fi
# the URL of this node's user: the head node's server, or the Sentinels of a group (multi-node.md, section 6)
if [ -n "$NEW_REDIS_ENV_FILE" ] && ! grep -qF -e "rediss://worker-$NODE_HOST:" -e "sentinel://worker-$NODE_HOST:" "$NEW_REDIS_ENV_FILE"; then
  echo "error: --redis-env $NEW_REDIS_ENV_FILE is not this node's: it must hold the URL of user worker-$NODE_HOST (redis-worker-$NODE_HOST.env)" >&2
  exit 2
fi
LAST_GPU=$((GPUS - 1))

step "system packages"
missing=()
for package in python3-venv python3-dev rsync; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  run apt-get update -qq
  run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
else
  echo "already installed: python3-venv python3-dev rsync"
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "error: draftgen needs Python 3.11 or newer; this node has $(python3 --version)" >&2
  exit 1
}

step "service user and code in $PREFIX"
# A writable home: SGLang, FlashInfer and Triton keep their JIT caches under ~/.cache.
# The code itself stays owned by root, so the services cannot change it.
if ! id "$SERVICE_USER" >/dev/null 2>&1; then
  run useradd --system --create-home --home-dir /var/lib/draftgen --shell /usr/sbin/nologin "$SERVICE_USER"
fi
if [ "$REPO" != "$PREFIX" ]; then
  run mkdir -p "$PREFIX"
  run rsync -a --delete --exclude .venv --exclude .git --exclude logs --exclude output "$REPO/" "$PREFIX/"
fi

step "virtual environment with draftgen[gpu] (SGLang, torch, CUDA wheels: several GB the first time)"
if [ ! -x "$PREFIX/.venv/bin/python" ]; then
  run python3 -m venv "$PREFIX/.venv"
fi
run "$PREFIX/.venv/bin/python" -m pip install --quiet --upgrade pip
run "$PREFIX/.venv/bin/python" -m pip install --quiet "$PREFIX[gpu]"

step "settings in $ENV_FILE"
run install -d -m 0750 -o root -g "$SERVICE_USER" "$ENV_DIR"
if [ -n "$NEW_ENV_FILE" ]; then
  run install -m 0640 -o root -g "$SERVICE_USER" "$NEW_ENV_FILE" "$ENV_FILE"
elif [ ! -f "$ENV_FILE" ]; then
  run install -m 0640 -o root -g "$SERVICE_USER" "$REPO/deploy/draftgen.env.example" "$ENV_FILE"
  if [ "$DRY_RUN" -eq 0 ]; then
    echo "wrote $ENV_FILE from the example: set DRAFTGEN_REDIS_URL, DRAFTGEN_MODEL_SOURCE and the rest," >&2
    echo "then run this script again" >&2
    exit 1
  fi
fi

if [ -n "$NEW_REDIS_ENV_FILE" ]; then
  run install -m 0600 -o root "$NEW_REDIS_ENV_FILE" "$NODE_REDIS_ENV_FILE"
fi

step "stage the model (skips files already there with the right size)"
# Sourced by bash as the service user, so S3 credentials and AWS_ENDPOINT_URL apply as in the units.
STAGE='set -a; . "$1"; set +a; exec "$2/.venv/bin/python" -m inference stage "$DRAFTGEN_MODEL_SOURCE" "$DRAFTGEN_MODEL_PATH"'
run runuser -u "$SERVICE_USER" -- bash -c "$STAGE" stage "$ENV_FILE" "$PREFIX"

step "systemd units for GPUs 0-$LAST_GPU"
for unit in "$REPO"/deploy/systemd/*.service; do
  run install -m 0644 "$unit" "$UNIT_DIR/$(basename "$unit")"
done
run systemctl daemon-reload

units=(draftgen-stage.service)
for gpu in $(seq 0 "$LAST_GPU"); do
  units+=("draftgen-sglang@$gpu.service" "draftgen-generate@$gpu.service")
done
if [ "$WITH_UPLOADER" -eq 1 ]; then units+=(draftgen-uploader.service); fi
if [ "$WITH_FLOWER" -eq 1 ]; then units+=(draftgen-flower.service); fi
run systemctl enable "${units[@]}"
# --no-block: a server takes minutes to report ready. Starting a running unit changes nothing.
if [ "$RESTART" -eq 1 ]; then
  run systemctl restart --no-block "${units[@]}"
else
  run systemctl start --no-block "${units[@]}"
fi

# Instances for GPUs this node no longer has (a re-run with a smaller --gpus) are stopped.
for unit in $(systemctl list-units --plain --no-legend --all 'draftgen-sglang@*' 'draftgen-generate@*' 2>/dev/null \
              | awk '{print $1}'); do
  index="${unit#*@}"; index="${index%.service}"
  if [ "$index" -gt "$LAST_GPU" ] 2>/dev/null; then
    run systemctl disable --now "$unit"
  fi
done

step "done"
cat <<EOF
Servers are loading; each reports ready only once it answers a real chat completion:
  systemctl list-units 'draftgen-*'
  journalctl -f -u 'draftgen-sglang@*'          # readiness, and the log tail of any failure
  tail -f /var/log/draftgen/sglang-gpu0.log     # SGLang's own log for GPU 0
EOF
