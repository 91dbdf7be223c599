#!/usr/bin/env bash
# A fake K-node cluster on one machine for multi-node tests: each "node" is a Linux network
# namespace joined to the root namespace by a veth pair into a bridge, and an ssh stand-in
# ("rsh") lets Open MPI's mpirun start one orted (and so one nodalrun) inside each node.
#
#   netns-cluster.sh up K             build nodes 1..K (tears down an earlier cluster first)
#   netns-cluster.sh down             kill everything inside the nodes, remove all of it (exit 0)
#   netns-cluster.sh mpirun-args K    print mpirun's arguments for K nodes, 1 slot each
#   netns-cluster.sh link NODE up|down   set node NODE's root-side veth up or down
#   netns-cluster.sh available        exit 0 when a cluster can be built here, else 3
#
# Layout (NET defaults to 10.78.0; 10.77.1.0/24, slbr0 and slurm-* belong to another tool):
#   namespace  ${PREFIX}k            (PREFIX: NODAL_NETNS_PREFIX, default nodal-n)
#   root side  ${VETH}k              (VETH:   NODAL_NETNS_VETH,   default nodalv) in the bridge
#   node side  eth0, NET.k/24, and lo up
#   bridge     ${BRIDGE}, NET.254/24 (BRIDGE: NODAL_NETNS_BRIDGE, default nodalbr0)
#   state dir  ${DIR}                (DIR:    NODAL_NETNS_DIR,    default /tmp/nodal-netns)
#              rsh    the ssh stand-in: rsh [-opts...] HOST CMD... runs CMD in HOST's namespace
#              hosts  the node addresses, one a line
#              nodes  "ADDRESS NAMESPACE VETH" a line, read by rsh
#              config the settings the cluster was built with, read by down
# NET: NODAL_NETNS_NET, the first three octets of a /24.
#
# Each node also gets its own hostname (its namespace's name) in a UTS namespace made by rsh,
# as real nodes would; NODAL_NETNS_UTS=0 keeps the machine's hostname everywhere. Nothing needs
# names to resolve: mpirun and the nodes use addresses only.
#
# Exit status: 0 ok, 1 failure, 2 bad arguments, 3 not possible here (not root, no netns).
# The cluster is one per machine (per DIR/PREFIX/BRIDGE/NET): tests that use it must not run
# at the same time as each other (e.g. a ctest RESOURCE_LOCK).
set -u
set -o pipefail

PREFIX=${NODAL_NETNS_PREFIX:-nodal-n}
VETH=${NODAL_NETNS_VETH:-nodalv}
BRIDGE=${NODAL_NETNS_BRIDGE:-nodalbr0}
NET=${NODAL_NETNS_NET:-10.78.0}
DIR=${NODAL_NETNS_DIR:-/tmp/nodal-netns}
UTS=${NODAL_NETNS_UTS:-1}
PATH=$PATH:/usr/sbin:/sbin
self=$(basename "$0")

usage() {
  cat >&2 <<EOF
usage: $self up K | down | mpirun-args K | link NODE up|down | available
  up K            build a K-node cluster of network namespaces (1 <= K <= 253)
  down            remove the cluster and everything running in it (always exit 0)
  mpirun-args K   print mpirun's arguments for K nodes, one slot each
  link NODE up|down   set node NODE's link (root-side veth ${VETH}NODE) up or down
  available       exit 0 when a cluster can be built here, 3 when not
environment: NODAL_NETNS_NET (${NET}), NODAL_NETNS_PREFIX (${PREFIX}),
  NODAL_NETNS_BRIDGE (${BRIDGE}), NODAL_NETNS_VETH (${VETH}), NODAL_NETNS_DIR (${DIR}),
  NODAL_NETNS_UTS (${UTS}: 1 gives each node its own hostname)
exit: 0 ok, 1 failure, 2 bad arguments, 3 not possible here
EOF
  exit 2
}

die() { echo "$self: $*" >&2; exit 1; }

# is_count S MAX: S is a decimal integer in 1..MAX.
is_count() {
  case $1 in '' | *[!0-9]* | 0*) return 1 ;; esac
  [ "${#1}" -le 3 ] && [ "$1" -le "$2" ]
}

check_settings() {
  case $NET in
    *[!0-9.]* | .* | *. | *..*) die "NODAL_NETNS_NET must be three octets like 10.78.0, not '$NET'" ;;
  esac
  [ "$(echo "$NET" | tr -cd . | wc -c)" -eq 2 ] \
    || die "NODAL_NETNS_NET must be three octets like 10.78.0, not '$NET'"
  # Interface names: at most 15 characters; the veth's number takes up to 3.
  [ "${#VETH}" -le 12 ] || die "NODAL_NETNS_VETH '$VETH' too long (12 characters at most)"
  [ "${#BRIDGE}" -le 15 ] || die "NODAL_NETNS_BRIDGE '$BRIDGE' too long (15 characters at most)"
  case $DIR in /*) ;; *) die "NODAL_NETNS_DIR must be an absolute path, not '$DIR'" ;; esac
  [ "$DIR" != / ] || die "NODAL_NETNS_DIR must not be /"
}

# probe: can this machine build the cluster? Prints why not on stderr; leaves nothing behind.
probe() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "$self: needs root (network namespaces, veths, a bridge); running as uid $(id -u)" >&2
    return 3
  fi
  if ! command -v ip >/dev/null 2>&1; then
    echo "$self: no 'ip' command (iproute2)" >&2
    return 3
  fi
  local ns="nodal-probe-$$" va="nodalpa$$" vb="nodalpb$$" br="nodalpbr$$" out rc=0
  va=${va:0:15}
  vb=${vb:0:15}
  br=${br:0:15}
  if ! out=$(ip netns add "$ns" 2>&1); then
    echo "$self: 'ip netns add' does not work here: $out" >&2
    return 3
  fi
  if ! out=$(ip netns exec "$ns" ip link set lo up 2>&1); then
    echo "$self: 'ip netns exec' does not work here: $out" >&2
    rc=3
  elif ! out=$(ip link add "$va" type veth peer name "$vb" 2>&1); then
    echo "$self: cannot make a veth pair: $out" >&2
    rc=3
  elif ! out=$(ip link set "$vb" netns "$ns" 2>&1); then
    echo "$self: cannot move a veth into a namespace: $out" >&2
    rc=3
  elif ! out=$(ip link add "$br" type bridge 2>&1); then
    echo "$self: cannot make a bridge: $out" >&2
    rc=3
  fi
  ip link del "$br" >/dev/null 2>&1
  ip link del "$va" >/dev/null 2>&1
  ip netns del "$ns" >/dev/null 2>&1
  return $rc
}

# Namespaces and root-side veths this script may have made, by name pattern: those of the
# settings in effect and those recorded in DIR/config by the last 'up'.
our_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^($(re "$PREFIX")${1:+|$1})[0-9]+$"
}
our_veths() {
  ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' \
    | grep -E "^($(re "$VETH")${1:+|$1})[0-9]+$"
}
re() { printf '%s' "$1" | sed 's/[][\.*^$+?(){}|]/\\&/g'; }

# agent_users: the processes (not this one) with DIR/rsh as one whole argument of theirs.
agent_users() {
  local found pid
  # grep finds itself too (the argument is its own); it has gone by the time of the -d test.
  found=$(grep -lzxF -- "$DIR/rsh" /proc/[0-9]*/cmdline 2>/dev/null | sed 's|^/proc/||; s|/cmdline$||')
  for pid in $found; do
    [ "$pid" != "$$" ] && [ -d "/proc/$pid" ] && echo "$pid"
  done
  return 0
}

# teardown: remove everything, quietly, whatever is there.
teardown() {
  set +e
  local old_prefix="" old_veth="" old_bridge="" ns veth i
  if [ -f "$DIR/config" ]; then
    old_prefix=$(sed -n 's/^prefix=//p' "$DIR/config")
    old_veth=$(sed -n 's/^veth=//p' "$DIR/config")
    old_bridge=$(sed -n 's/^bridge=//p' "$DIR/config")
  fi
  local prefix_re="" veth_re=""
  [ -n "$old_prefix" ] && [ "$old_prefix" != "$PREFIX" ] && prefix_re=$(re "$old_prefix")
  [ -n "$old_veth" ] && [ "$old_veth" != "$VETH" ] && veth_re=$(re "$old_veth")
  local namespaces
  namespaces=$(our_namespaces "$prefix_re")
  # Kill what runs inside: TERM first, KILL what is left after a moment.
  # Also the launchers outside them (mpirun in the root namespace) that name this cluster's
  # rsh as an argument of their own: one whose nodes are gone may otherwise wait for ever.
  local -a pids
  for i in 1 2 3 4 5 6 7 8 9 10 11; do
    pids=()
    for ns in $namespaces; do
      mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$ns" 2>/dev/null)
    done
    mapfile -t -O "${#pids[@]}" pids < <(agent_users)
    [ "${#pids[@]}" -gt 0 ] || break
    if [ "$i" -eq 1 ]; then
      kill -TERM "${pids[@]}" 2>/dev/null
    elif [ "$i" -ge 6 ]; then
      kill -KILL "${pids[@]}" 2>/dev/null
    fi
    sleep 0.2
  done
  # The root-side ends first: deleting a namespace frees its devices only once nothing holds it.
  for veth in $(our_veths "$veth_re"); do
    ip link del "$veth" >/dev/null 2>&1
  done
  for ns in $namespaces; do
    ip netns del "$ns" >/dev/null 2>&1
  done
  ip link del "$BRIDGE" >/dev/null 2>&1
  [ -n "$old_bridge" ] && [ "$old_bridge" != "$BRIDGE" ] && ip link del "$old_bridge" >/dev/null 2>&1
  rm -rf "$DIR"
  return 0
}

write_rsh() {
  cat > "$DIR/rsh" <<EOF
#!/bin/sh
# ssh stand-in for mpirun (plm_rsh_agent): rsh [-options...] HOST CMD...
# Runs CMD (joined by spaces and read by sh, as ssh's remote shell would) inside the network
# namespace of node HOST (its address or its namespace's name), in the current directory
# where it exists there, with the environment passed through.
PATH=\$PATH:/usr/sbin:/sbin
nodes='$DIR/nodes'
uts='$UTS'
EOF
  cat >> "$DIR/rsh" <<'EOF'
while [ $# -gt 0 ]; do
  case $1 in
    # ssh options that take a value
    -[bcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "rsh: usage: rsh [-options...] HOST CMD..." >&2; exit 255; }
host=${1#*@}
shift
ns=$(awk -v h="$host" '$1 == h || $2 == h { print $2; exit }' "$nodes" 2>/dev/null)
if [ -z "$ns" ]; then
  echo "rsh: no node '$host' in $nodes" >&2
  exit 255
fi
[ $# -ge 1 ] || { echo "rsh: no command for $host (no interactive shells here)" >&2; exit 255; }
cd "$PWD" 2>/dev/null || cd / || exit 255
if [ "$uts" = 1 ] && command -v unshare >/dev/null 2>&1; then
  # Its own hostname, as a real node: the namespace's name.
  exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$1" && shift && exec sh -c "$*"' rsh "$ns" "$@"
fi
exec ip netns exec "$ns" sh -c "$*"
EOF
  chmod 755 "$DIR/rsh"
}

node_reachable() {
  ip link show "$VETH$1" 2>/dev/null | grep -q 'LOWER_UP' || return 1
  ip -n "$PREFIX$1" link show eth0 2>/dev/null | grep -q 'LOWER_UP' || return 1
  if command -v ping >/dev/null 2>&1; then ping -c 1 -W 1 "$NET.$1" >/dev/null 2>&1 || return 1; fi
  return 0
}

cmd_up() {
  local k=$1 i ns veth addr out
  probe || exit 3
  # Another interface (not this script's bridge) already in NET would take its traffic.
  out=$(ip -o -4 addr show 2>/dev/null | awk -v b="$BRIDGE" '$2 != b {print $2, $4}' \
    | grep -F " $NET." || true)
  [ -z "$out" ] || die "subnet $NET.0/24 is already in use here ($out); set NODAL_NETNS_NET"
  teardown
  # (up_built is global: the EXIT trap runs after this function's locals are gone.)
  up_built=0
  trap 'if [ "$up_built" -eq 0 ]; then echo "$self: up failed; removing the half-built cluster" >&2; teardown; exit 1; fi' EXIT
  trap 'exit 1' INT TERM HUP
  set -e
  mkdir -p "$DIR"
  ip link add "$BRIDGE" type bridge
  ip addr add "$NET.254/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  : > "$DIR/hosts"
  : > "$DIR/nodes"
  printf 'prefix=%s\nveth=%s\nbridge=%s\nnet=%s\nnodes=%s\n' \
    "$PREFIX" "$VETH" "$BRIDGE" "$NET" "$k" > "$DIR/config"
  for i in $(seq 1 "$k"); do
    ns=$PREFIX$i
    veth=$VETH$i
    addr=$NET.$i
    ip netns add "$ns"
    # The peer gets a temporary name in the root namespace, eth0 once inside.
    ip link add "$veth" type veth peer name "${VETH}p$i"
    ip link set "${VETH}p$i" netns "$ns"
    ip -n "$ns" link set "${VETH}p$i" name eth0
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip link set "$veth" master "$BRIDGE"
    ip link set "$veth" up
    echo "$addr" >> "$DIR/hosts"
    echo "$addr $ns $veth" >> "$DIR/nodes"
  done
  write_rsh
  # Every node's link is up at both ends (and answers ping from the root namespace, where
  # there is a ping), as mpirun will need.
  for i in $(seq 1 "$k"); do
    local tries=0
    until node_reachable "$i"; do
      tries=$((tries + 1))
      [ $tries -lt 25 ] || { echo "$self: node $i ($NET.$i) is not reachable" >&2; exit 1; }
      sleep 0.2
    done
  done
  set +e
  up_built=1
  trap - EXIT INT TERM HUP
  echo "$self: $k node(s) up: $(tr '\n' ' ' < "$DIR/hosts")(bridge $BRIDGE $NET.254, state $DIR)" >&2
}

cmd_mpirun_args() {
  local k=$1 hosts="" i
  for i in $(seq 1 "$k"); do hosts="$hosts${hosts:+,}$NET.$i:1"; done
  echo "--allow-run-as-root --mca plm_rsh_agent $DIR/rsh --host $hosts" \
    "--mca btl tcp,self --mca btl_tcp_if_include $NET.0/24 --mca oob_tcp_if_include $NET.0/24" \
    "--bind-to none"
}

cmd_link() {
  local node=$1 state=$2
  ip link show "$VETH$node" >/dev/null 2>&1 || die "no node $node (no link $VETH$node)"
  ip link set "$VETH$node" "$state" || die "could not set $VETH$node $state"
}

[ $# -ge 1 ] || usage
check_settings
case $1 in
  up)
    { [ $# -eq 2 ] && is_count "$2" 253; } || usage
    cmd_up "$2"
    ;;
  down)
    [ $# -eq 1 ] || usage
    teardown
    exit 0
    ;;
  mpirun-args)
    { [ $# -eq 2 ] && is_count "$2" 253; } || usage
    cmd_mpirun_args "$2"
    ;;
  link)
    { [ $# -eq 3 ] && is_count "$2" 253; } || usage
    case $3 in up | down) ;; *) usage ;; esac
    cmd_link "$2" "$3"
    ;;
  available)
    [ $# -eq 1 ] || usage
    probe || exit 3
    ;;
  -h | --help | help) usage ;;
  *) usage ;;
esac
