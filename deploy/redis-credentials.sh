#!/usr/bin/env bash
# Redis credentials for a draftgen fleet, generated once and kept: run it on the head node before
# redis-server's first start, and again whenever a GPU node joins or leaves (it is idempotent: existing
# passwords are reused). Name every GPU node each time: a node left out loses its Redis user.
#
#   sudo deploy/redis-credentials.sh --host head.example.internal [--port 6380] [--dir /etc/draftgen]
#        [--ca /etc/draftgen/redis-ca.pem] [--redis-user redis]
#        (--gpu-nodes /etc/draftgen/gpu-nodes | --gpu-node gpu1 [--gpu-node gpu2 ...])
#
# GPU nodes: the host name of each node's worker labels (`hostname` there, or its DRAFTGEN_HOSTNAME),
# with --gpu-node (repeatable) or --gpu-nodes FILE (one per line; blank lines and # comments ignored);
# letters, digits, '.', '_' and '-' only. Each gets its own Redis user, worker-<host>.
#
# Writes, each readable by its owner only (umask 077):
#   DIR/redis-passwords/<user>   one random 256-bit password per user of deploy/redis-users.acl
#   DIR/redis-users.acl          the ACL file redis-server loads (`aclfile`): the template with each
#                                password's SHA-256 in place (no password in it); owned by --redis-user
#   DIR/redis-<user>.env         DRAFTGEN_REDIS_URL=rediss://<user>:<password>@HOST:PORT/0?... for the
#                                processes of that user (deploy/multi-node.md, section 1); a GPU node's
#                                is DIR/redis-worker-<host>.env
set -euo pipefail
umask 077

DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TEMPLATE="$DEPLOY_DIR/redis-users.acl"
USERS=(admin producer uploader flower)
NODE_PLACEHOLDER=@GPU_NODE@
NODE_HASH_PLACEHOLDER=@GPU_NODE_WORKER@
NODE_USER_PREFIX=worker-
# A host name as a label holds it, and nothing a key pattern, a URL's user part or a file name reads.
NODE_NAME_PATTERN='^[A-Za-z0-9][A-Za-z0-9._-]*$'
NODE_NAME_MAX_CHARS=253
PASSWORD_BYTES=32

dir=/etc/draftgen
host=""
port=6380
ca=""
redis_user=redis
gpu_nodes=()

usage() {
    sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

bad_usage() {
    echo "redis-credentials.sh: $1" >&2
    exit 2
}

add_gpu_node() {  # one GPU node's host name, checked; a name given twice counts once
    local node="$1" known
    [[ "$node" =~ $NODE_NAME_PATTERN && ${#node} -le $NODE_NAME_MAX_CHARS ]] ||
        bad_usage "GPU node '$node' is no host name: letters, digits, '.', '_' and '-' only, at most $NODE_NAME_MAX_CHARS"
    for known in "${gpu_nodes[@]}"; do
        [[ "$known" != "$node" ]] || return 0
    done
    gpu_nodes+=("$node")
}

add_gpu_nodes_of() {  # the host names a file lists, one per line
    local file="$1" line
    [[ -r "$file" ]] || bad_usage "--gpu-nodes $file: no such readable file"
    while IFS= read -r line || [[ -n "$line" ]]; do
        line="${line%%#*}"
        line="${line//[[:space:]]/}"
        [[ -z "$line" ]] || add_gpu_node "$line"
    done <"$file"
}

while (($#)); do
    case "$1" in
        --dir) dir="$2"; shift 2 ;;
        --host) host="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --ca) ca="$2"; shift 2 ;;
        --redis-user) redis_user="$2"; shift 2 ;;
        --gpu-node) (($# > 1)) || bad_usage "--gpu-node needs a host name"; add_gpu_node "$2"; shift 2 ;;
        --gpu-nodes) (($# > 1)) || bad_usage "--gpu-nodes needs a file"; add_gpu_nodes_of "$2"; shift 2 ;;
        -h | --help) usage 0 ;;
        *) echo "unknown option: $1" >&2; usage 2 ;;
    esac
done
[[ -n "$host" ]] || bad_usage "--host is required: the name every node reaches Redis by"
((${#gpu_nodes[@]})) || bad_usage "name the GPU nodes (--gpu-node HOST or --gpu-nodes FILE): each gets its own Redis user"
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
    template_lines | grep -vF "$NODE_PLACEHOLDER" | sed "${script[@]}"
    render_node_users
}

render_node_users() {  # the one template line of a GPU node's user, once per node
    local line node
    line="$(template_lines | grep -F "$NODE_PLACEHOLDER")"
    for node in "${gpu_nodes[@]}"; do
        printf '%s\n' "$line" | sed -e "s/$NODE_HASH_PLACEHOLDER/$(sha256_of "$(password_of "$NODE_USER_PREFIX$node")")/" \
            -e "s/$NODE_PLACEHOLDER/$node/g"
    done
}

template_lines() {
    grep -v '^#' "$TEMPLATE" | grep -v '^[[:space:]]*$'
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
node_users=("${gpu_nodes[@]/#/$NODE_USER_PREFIX}")
for user in "${USERS[@]}" "${node_users[@]}"; do
    write_env "$user"
done
echo "wrote $dir/redis-users.acl and $dir/redis-{$(IFS=,; echo "${USERS[*]} ${node_users[*]}" | tr ' ' ,)}.env (passwords in $dir/redis-passwords/)"
