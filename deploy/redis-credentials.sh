#!/usr/bin/env bash
# Redis credentials for a draftgen fleet, generated once and kept: run it on the head node before
# redis-server's first start, and again whenever a GPU node joins or leaves (it is idempotent: existing
# passwords are reused). Name every GPU node each time: a node left out loses its Redis user.
#
#   sudo deploy/redis-credentials.sh --host head.example.internal [--port 6380] [--dir /etc/draftgen]
#        [--ca /etc/draftgen/redis-ca.pem] [--redis-user redis]
#        (--gpu-nodes /etc/draftgen/gpu-nodes | --gpu-node gpu1 [--gpu-node gpu2 ...])
#        [--sentinel HOST[:PORT] ... [--master-name draftgen]]
#
# GPU nodes: the host name of each node's worker labels (`hostname` there, or its DRAFTGEN_HOSTNAME),
# with --gpu-node (repeatable) or --gpu-nodes FILE (one per line; blank lines and # comments ignored);
# letters, digits, '.', '_' and '-' only. Each gets its own Redis user, worker-<host>.
# Sentinels (deploy/multi-node.md, section 6): --sentinel once per Sentinel (port 26379 unless given);
# --host and --port then name the first primary, and every URL names the Sentinels instead.
#
# Writes, each readable by its owner only (umask 077):
#   DIR/redis-passwords/<user>   one random 256-bit password per user of deploy/redis-users.acl
#   DIR/redis-users.acl          the ACL file every redis-server loads (`aclfile`): the template with each
#                                password's SHA-256 in place (no password in it); owned by --redis-user
#   DIR/redis-<user>.env         DRAFTGEN_REDIS_URL=rediss://<user>:<password>@HOST:PORT/0?... for the
#                                processes of that user (deploy/multi-node.md, section 1), or with
#                                --sentinel sentinel://<user>:<password>@SENTINEL1/0?master_name=...;...;
#                                a GPU node's is DIR/redis-worker-<host>.env
#   DIR/redis-replication.conf   masteruser and masterauth: how any redis-server logs in to the primary it
#                                replicates (every server includes it: a failover makes a primary a replica)
#   DIR/sentinel.conf.initial    with --sentinel: a Sentinel's first config (the primary to watch, how the
#                                Sentinel logs in); copied once to each Sentinel host, which rewrites its copy
#   DIR/sentinel-users.acl       with --sentinel: the users every Sentinel loads (deploy/sentinel-users.acl)
set -euo pipefail
umask 077

DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TEMPLATE="$DEPLOY_DIR/redis-users.acl"
SENTINEL_TEMPLATE="$DEPLOY_DIR/sentinel-users.acl"
USERS=(admin producer uploader flower)  # each gets an env file: the processes that log in as it
SERVER_USERS=(replica sentinel)  # redis-server's and the Sentinels' own logins to a server; no env file
REPLICA_USER=replica
SENTINEL_USER=sentinel
DEFAULT_SENTINEL_PORT=26379
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
sentinels=()
master_name=draftgen

usage() {
    sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
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

add_sentinel() {  # HOST or HOST:PORT, checked
    local host="${1%:*}" port="${1##*:}"
    [[ "$1" == *:* ]] || port=$DEFAULT_SENTINEL_PORT
    [[ "$host" =~ $NODE_NAME_PATTERN && "$port" =~ ^[0-9]+$ ]] ||
        bad_usage "--sentinel '$1' is not HOST or HOST:PORT"
    sentinels+=("$host:$port")
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
        --sentinel) (($# > 1)) || bad_usage "--sentinel needs HOST[:PORT]"; add_sentinel "$2"; shift 2 ;;
        --master-name) master_name="$2"; shift 2 ;;
        -h | --help) usage 0 ;;
        *) echo "unknown option: $1" >&2; usage 2 ;;
    esac
done
[[ -n "$host" ]] || bad_usage "--host is required: the name every node reaches Redis by"
[[ "$master_name" =~ $NODE_NAME_PATTERN ]] || bad_usage "--master-name '$master_name': letters, digits, '.', '_' and '-' only"
((${#sentinels[@]} == 0 || ${#sentinels[@]} >= 3)) ||
    bad_usage "name at least three Sentinels (--sentinel, on three hosts): fewer cannot agree a primary is down when one of their hosts is"
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

render_acl() {  # a template without its comments, each @USER@ replaced by that user's hash
    local template="$1" script=() user
    for user in "${USERS[@]}" "${SERVER_USERS[@]}"; do
        script+=(-e "s/@${user^^}@/$(sha256_of "$(password_of "$user")")/g")
    done
    template_lines "$template" | grep -vF "$NODE_PLACEHOLDER" | sed "${script[@]}"
    render_node_users "$template"
}

render_node_users() {  # the one template line of a GPU node's user, once per node
    local line node
    line="$(template_lines "$1" | grep -F "$NODE_PLACEHOLDER")"
    for node in "${gpu_nodes[@]}"; do
        printf '%s\n' "$line" | sed -e "s/$NODE_HASH_PLACEHOLDER/$(sha256_of "$(password_of "$NODE_USER_PREFIX$node")")/" \
            -e "s/$NODE_PLACEHOLDER/$node/g"
    done
}

template_lines() {
    grep -v '^#' "$1" | grep -v '^[[:space:]]*$'
}

url_of() {  # the URL of one user: TLS, the server's certificate checked against the CA
    local user="$1" password tls first others=""
    password="$(password_of "$user")"
    tls="ssl_cert_reqs=required&ssl_ca_certs=$ca"
    if ((${#sentinels[@]} == 0)); then
        printf 'rediss://%s:%s@%s:%s/0?%s' "$user" "$password" "$host" "$port" "$tls"
        return
    fi
    first="${sentinels[0]}"
    for sentinel in "${sentinels[@]:1}"; do
        others+=";sentinel://$sentinel"
    done
    printf 'sentinel://%s:%s@%s/0?master_name=%s&sentinel_auth=true&%s%s' \
        "$user" "$password" "$first" "$master_name" "$tls" "$others"
}

write_env() {
    local user="$1"
    printf 'DRAFTGEN_REDIS_URL="%s"\n' "$(url_of "$user")" >"$dir/redis-$user.env.tmp"
    mv "$dir/redis-$user.env.tmp" "$dir/redis-$user.env"
}

write_replication_conf() {  # how every redis-server logs in to the primary it follows
    printf 'masteruser %s\nmasterauth %s\n' "$REPLICA_USER" "$(password_of "$REPLICA_USER")" \
        >"$dir/redis-replication.conf.tmp"
    mv "$dir/redis-replication.conf.tmp" "$dir/redis-replication.conf"
}

write_sentinel_conf() {  # a Sentinel's first config: the shipped settings, the primary, its login
    local quorum=$((${#sentinels[@]} / 2 + 1))
    {
        echo "# draftgen's Sentinel: copy to /etc/draftgen/redis/sentinel.conf on each Sentinel host before its"
        echo "# first start (deploy/multi-node.md, section 6); the Sentinel rewrites its copy from then on."
        echo "include $DEPLOY_DIR/sentinel.conf"
        echo "aclfile $dir/sentinel-users.acl"
        echo "sentinel sentinel-user $SENTINEL_USER"
        echo "sentinel sentinel-pass $(password_of "$SENTINEL_USER")"
        echo "sentinel monitor $master_name $host $port $quorum"
        echo "sentinel auth-user $master_name $SENTINEL_USER"
        echo "sentinel auth-pass $master_name $(password_of "$SENTINEL_USER")"
        sed -e '/^#/d' -e '/^[[:space:]]*$/d' -e "s/@MASTER_NAME@/$master_name/g" "$DEPLOY_DIR/sentinel-primary.conf"
    } >"$dir/sentinel.conf.initial.tmp"
    mv "$dir/sentinel.conf.initial.tmp" "$dir/sentinel.conf.initial"
}

for_redis() {  # a file redis-server (or a Sentinel) reads: its user's, where this runs as root
    if [[ $EUID -eq 0 ]] && id "$redis_user" >/dev/null 2>&1; then
        chown "$redis_user:" "$1"
    fi
}

mkdir -p "$dir"
render_acl "$TEMPLATE" >"$dir/redis-users.acl.tmp"
for_redis "$dir/redis-users.acl.tmp"
mv "$dir/redis-users.acl.tmp" "$dir/redis-users.acl"
node_users=("${gpu_nodes[@]/#/$NODE_USER_PREFIX}")
for user in "${USERS[@]}" "${node_users[@]}"; do
    write_env "$user"
done
write_replication_conf
for_redis "$dir/redis-replication.conf"
if ((${#sentinels[@]})); then
    render_acl "$SENTINEL_TEMPLATE" >"$dir/sentinel-users.acl.tmp"
    for_redis "$dir/sentinel-users.acl.tmp"
    mv "$dir/sentinel-users.acl.tmp" "$dir/sentinel-users.acl"
    write_sentinel_conf
    echo "wrote $dir/sentinel.conf.initial and $dir/sentinel-users.acl (the Sentinels' first config and their users: multi-node.md, section 6)"
fi
echo "wrote $dir/redis-users.acl and $dir/redis-{$(IFS=,; echo "${USERS[*]} ${node_users[*]}" | tr ' ' ,)}.env and $dir/redis-replication.conf (passwords in $dir/redis-passwords/)"
