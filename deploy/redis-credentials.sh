#!/usr/bin/env bash
# Redis credentials for a draftgen fleet, generated once and kept: run it on the head node before
# redis-server's first start (and again at any time: it is idempotent, existing passwords are reused).
#
#   sudo deploy/redis-credentials.sh --host head.example.internal [--port 6380] [--dir /etc/draftgen]
#        [--ca /etc/draftgen/redis-ca.pem] [--redis-user redis]
#
# Writes, each readable by its owner only (umask 077):
#   DIR/redis-passwords/<user>   one random 256-bit password per user of deploy/redis-users.acl
#   DIR/redis-users.acl          the ACL file redis-server loads (`aclfile`): the template with each
#                                password's SHA-256 in place (no password in it); owned by --redis-user
#   DIR/redis-<user>.env         DRAFTGEN_REDIS_URL=rediss://<user>:<password>@HOST:PORT/0?... for the
#                                processes of that user (deploy/multi-node.md, section 1)
set -euo pipefail
umask 077

DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TEMPLATE="$DEPLOY_DIR/redis-users.acl"
USERS=(admin producer worker uploader flower)
PASSWORD_BYTES=32

dir=/etc/draftgen
host=""
port=6380
ca=""
redis_user=redis

usage() {
    sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

while (($#)); do
    case "$1" in
        --dir) dir="$2"; shift 2 ;;
        --host) host="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --ca) ca="$2"; shift 2 ;;
        --redis-user) redis_user="$2"; shift 2 ;;
        -h | --help) usage 0 ;;
        *) echo "unknown option: $1" >&2; usage 2 ;;
    esac
done
[[ -n "$host" ]] || { echo "--host is required: the name every node reaches Redis by" >&2; exit 2; }
ca="${ca:-$dir/redis-ca.pem}"

password_of() {  # the user's password, made on first use and kept
    local file="$dir/redis-passwords/$1"
    if [[ ! -s "$file" ]]; then
        mkdir -p "$dir/redis-passwords"
        openssl rand -hex "$PASSWORD_BYTES" >"$file.tmp"
        mv "$file.tmp" "$file"
    fi
    tr -d '\n' <"$file"
}

sha256_of() {
    printf '%s' "$1" | sha256sum | cut -d' ' -f1
}

render_acl() {  # the template without its comments, each @USER@ replaced by that user's hash
    local script=() user
    for user in "${USERS[@]}"; do
        script+=(-e "s/@${user^^}@/$(sha256_of "$(password_of "$user")")/g")
    done
    grep -v '^#' "$TEMPLATE" | grep -v '^[[:space:]]*$' | sed "${script[@]}"
}

write_env() {  # the URL of one user: TLS, the server's certificate checked against the CA
    local user="$1" password
    password="$(password_of "$user")"
    printf 'DRAFTGEN_REDIS_URL="rediss://%s:%s@%s:%s/0?ssl_cert_reqs=required&ssl_ca_certs=%s"\n' \
        "$user" "$password" "$host" "$port" "$ca" >"$dir/redis-$user.env.tmp"
    mv "$dir/redis-$user.env.tmp" "$dir/redis-$user.env"
}

mkdir -p "$dir"
render_acl >"$dir/redis-users.acl.tmp"
if [[ $EUID -eq 0 ]] && id "$redis_user" >/dev/null 2>&1; then
    chown "$redis_user:" "$dir/redis-users.acl.tmp"
fi
mv "$dir/redis-users.acl.tmp" "$dir/redis-users.acl"
for user in "${USERS[@]}"; do
    write_env "$user"
done
echo "wrote $dir/redis-users.acl and $dir/redis-{$(IFS=,; echo "${USERS[*]}")}.env (passwords in $dir/redis-passwords/)"
