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

# shellcheck disable=SC2034  # KNOB and SUFFIX are read by netns-lib.sh
KNOB=NODAL_NETNS
SUFFIX='[0-9]+'
# shellcheck source=tests/support/netns-lib.sh
. "$(dirname "$0")/netns-lib.sh"

check_settings() { check_net_settings 10.78.0; }

# probe: can this machine build the cluster? Prints why not on stderr; leaves nothing behind.
in_namespace() { ip netns exec "$1" ip link set lo up; }
probe() { probe_netns in_namespace; }

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

# teardown: remove everything, quietly, whatever is there; outside the namespaces, the launchers
# (mpirun in the root namespace) that name this cluster's rsh: one whose nodes are gone may
# otherwise wait for ever.
teardown() { teardown_cluster agent_users; }

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
  check_subnet_free
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
