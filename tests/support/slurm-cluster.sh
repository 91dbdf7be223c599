#!/usr/bin/env bash
# A real K-node Slurm 22.05 cluster on one machine for multi-node tests: munged, slurmctld and
# one slurmd per node, each daemon in a network namespace of its own (a veth into a bridge) and a
# UTS namespace with its own hostname, so that a test can run
#   SLURM_CONF=... srun -N K --ntasks-per-node=1 --mpi=pmix -K1 nodalrun -n N prog
#
#   slurm-cluster.sh up K        build the cluster, wait until its K nodes are idle
#                                (tears down an earlier cluster first)
#   slurm-cluster.sh down        kill everything it started, remove all of it (exit 0)
#   slurm-cluster.sh env         print SLURM_CONF=PATH, the setting srun/sinfo/squeue need
#   slurm-cluster.sh available   exit 0 when a cluster can be built here, else 3
#
# Layout (NET defaults to 10.79.0; 10.78.0.0/24, nodalbr0, nodal-n* belong to netns-cluster.sh,
# 10.77.1.0/24, slbr0, slurm-* and /tmp/slurm-cluster to another tool):
#   node k     namespace and hostname and Slurm NodeName ${PREFIX}k (PREFIX: NODAL_SLURM_PREFIX,
#              default nodal-s), eth0 NET.k/24, slurmd on port PORT+1
#   controller namespace and hostname ${PREFIX}ctl (= SlurmctldHost), NET.253, slurmctld on PORT
#              (PORT: NODAL_SLURM_PORT, default 6917: a system Slurm on 6817/6818 may coexist)
#   root side  veths ${VETH}k, ${VETH}ctl (VETH: NODAL_SLURM_VETH, default nodalsv) in the bridge
#              ${BRIDGE}, NET.254/24 (BRIDGE: NODAL_SLURM_BRIDGE, default nodalsbr0): srun runs here
#   munged     in the root namespace as user munge, with its own key and socket
#   state dir  ${DIR} (NODAL_SLURM_DIR, default /tmp/nodal-slurm)
#              etc/slurm.conf  the configuration (nothing in /etc/slurm is read or written)
#              munge/          key, socket (slurm.conf's AuthInfo names it), pid file, munged.log
#              log/            slurmctld.log, slurmd-NODE.log
#              ctld/, NODE/    slurmctld's state; each slurmd's spool and TmpFS (PMIx dirs)
#              config          the settings the cluster was built with, read by down
# NET: NODAL_SLURM_NET, the first three octets of a /24. Each node declares NODAL_SLURM_CPUS CPUs
# (default 4; SlurmdParameters=config_overrides), so 4 tasks a node need no --overcommit.
# No cgroups: proctrack/linuxproc, task/none. Daemons start under nsenter --net plus unshare --uts,
# not 'ip netns exec': that remounts /sys, hiding /sys/fs/cgroup, and slurmd 22.05 then refuses
# to start. mpi/pmix dlopens pmix2/lib/libpmix.so, which only libpmix-dev ships.
#
# Exit status: 0 ok, 1 failure, 2 bad arguments, 3 not possible here (not root, no netns, no
# Slurm). The cluster is one per machine (per DIR/PREFIX/BRIDGE/NET/PORT): tests that use it
# must not run at the same time as each other (e.g. a ctest RESOURCE_LOCK).
set -u
set -o pipefail

PREFIX=${NODAL_SLURM_PREFIX:-nodal-s}
VETH=${NODAL_SLURM_VETH:-nodalsv}
BRIDGE=${NODAL_SLURM_BRIDGE:-nodalsbr0}
NET=${NODAL_SLURM_NET:-10.79.0}
DIR=${NODAL_SLURM_DIR:-/tmp/nodal-slurm}
PORT=${NODAL_SLURM_PORT:-6917}
CPUS=${NODAL_SLURM_CPUS:-4}
TIMEOUT=${NODAL_SLURM_TIMEOUT:-20}
PATH=$PATH:/usr/sbin:/sbin
CONF=$DIR/etc/slurm.conf
SOCKET=$DIR/munge/socket
LIBDIR=/usr/lib/$(uname -m)-linux-gnu
PMIX_PLUGIN=$LIBDIR/slurm-wlm/mpi_pmix_v4.so
PMIX_LIB=$LIBDIR/pmix2/lib/libpmix.so
self=$(basename "$0")

usage() {
  cat >&2 <<EOF
usage: $self up K | down | env | available
  up K        build a K-node Slurm cluster and wait until its nodes are idle (1 <= K <= 252)
  down        remove the cluster and everything running in it (always exit 0)
  env         print SLURM_CONF=$CONF
  available   exit 0 when a cluster can be built here, 3 when not
environment: NODAL_SLURM_NET (${NET}), NODAL_SLURM_PREFIX (${PREFIX}),
  NODAL_SLURM_BRIDGE (${BRIDGE}), NODAL_SLURM_VETH (${VETH}), NODAL_SLURM_DIR (${DIR}),
  NODAL_SLURM_PORT (${PORT}: slurmctld's, slurmd's is one more), NODAL_SLURM_CPUS (${CPUS}),
  NODAL_SLURM_TIMEOUT (${TIMEOUT}: seconds up waits for idle nodes)
exit: 0 ok, 1 failure, 2 bad arguments, 3 not possible here
EOF
  exit 2
}

# shellcheck disable=SC2034  # KNOB and SUFFIX are read by netns-lib.sh
KNOB=NODAL_SLURM
SUFFIX='([0-9]+|ctl)'
# shellcheck source=tests/support/netns-lib.sh
. "$(dirname "$0")/netns-lib.sh"

check_settings() {
  check_net_settings 10.79.0
  case $PREFIX in '' | *[!a-z0-9-]* | [0-9-]*) die "NODAL_SLURM_PREFIX must be like nodal-s, not '$PREFIX'" ;; esac
  is_count "$PORT" 65534 || die "NODAL_SLURM_PORT must be a port number, not '$PORT'"
  is_count "$CPUS" 1024 || die "NODAL_SLURM_CPUS must be a count, not '$CPUS'"
  is_count "$TIMEOUT" 3600 || die "NODAL_SLURM_TIMEOUT must be seconds, not '$TIMEOUT'"
}

# probe: can this machine build the cluster? Prints why not (one line) on stderr; leaves nothing.
in_namespace() { nsenter --net="/run/netns/$1" unshare --uts -- hostname "$1"; }
probe() {
  local c
  if [ "$(id -u)" -ne 0 ]; then
    echo "$self: needs root (network namespaces, veths, a bridge); running as uid $(id -u)" >&2
    return 3
  fi
  for c in ip nsenter unshare hostname runuser munged slurmctld slurmd srun sinfo; do
    command -v "$c" >/dev/null 2>&1 && continue
    echo "$self: no '$c' command (Debian: iproute2 util-linux munge slurmctld slurmd slurm-client)" >&2
    return 3
  done
  id munge >/dev/null 2>&1 || { echo "$self: no user 'munge' (Debian: munge)" >&2; return 3; }
  for c in "$PMIX_PLUGIN" "$PMIX_LIB"; do
    [ -e "$c" ] && continue
    echo "$self: no $c: srun --mpi=pmix cannot work (Debian: slurm-wlm-basic-plugins libpmix-dev)" >&2
    return 3
  done
  probe_netns in_namespace
}

# our_processes: outside the namespaces, munged (its socket is one of its arguments) and the
# srun/salloc whose SLURM_CONF is this cluster's (their nodes are going: they might wait long).
our_processes() {
  local pid found
  # grep finds itself too (the strings are its own arguments); it has gone by the -d test.
  found=$(grep -lzxF -e "$SOCKET" -e "$CONF" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3)
  for pid in $found; do
    [ "$pid" != "$$" ] && [ -d "/proc/$pid" ] && echo "$pid"
  done
  found=$(grep -lzxF "SLURM_CONF=$CONF" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3)
  for pid in $found; do
    case $(cat "/proc/$pid/comm" 2>/dev/null) in srun | salloc) echo "$pid" ;; esac
  done
  return 0
}

# teardown: remove everything, quietly, whatever is there; outside the namespaces, munged and srun
# (slurmd takes 1-2 s to go on TERM).
teardown() { teardown_cluster our_processes; }

write_conf() {
  local k=$1
  cat > "$CONF" <<EOF
# Written by $self: $k nodes in network namespaces on one machine.
ClusterName=nodal
SlurmctldHost=${PREFIX}ctl($NET.253)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
StateSaveLocation=$DIR/ctld
SlurmctldPidFile=$DIR/ctld/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdSpoolDir=$DIR/%n/spool
SlurmdPidFile=$DIR/%n/slurmd.pid
SlurmdLogFile=$DIR/log/slurmd-%n.log
TmpFS=$DIR/%n/tmp
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
# An srun that comes within a few ms of the last one's end finds its nodes still completing and
# waits for the next scheduling pass: batch_sched_delay=0 makes that at most ~1 s, not ~3 s.
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MessageTimeout=10
KillWait=2
MinJobAge=10
InactiveLimit=0
NodeName=${PREFIX}[1-$k] NodeAddr=$(seq -s, -f "$NET.%g" 1 "$k") CPUs=$CPUS State=UNKNOWN
PartitionName=nodal Nodes=${PREFIX}[1-$k] Default=YES MaxTime=INFINITE State=UP
EOF
  # Read by slurmd's cgroup plugin, which 22.05 loads whatever the other plugins are.
  echo "IgnoreSystemd=yes" > "$DIR/etc/cgroup.conf"
}

# start_in NAMESPACE CMD...: CMD in that network namespace, with the namespace's name as hostname.
start_in() {
  local ns=$1
  shift
  # shellcheck disable=SC2016 # $1 and $@ are the inner sh's
  nsenter --net="/run/netns/$ns" unshare --uts -- sh -c 'hostname "$1" && shift && exec "$@"' sh "$ns" "$@"
}

# add_node NAME ADDRESS: namespace NAME, eth0 = ADDRESS/24, its veth's root side in the bridge.
add_node() {
  local veth=$VETH${1#"$PREFIX"}
  ip netns add "$1"
  ip link add "$veth" type veth peer name eth0 netns "$1"
  ip -n "$1" addr add "$2/24" dev eth0
  ip -n "$1" link set lo up
  ip -n "$1" link set eth0 up
  ip link set "$veth" master "$BRIDGE"
  ip link set "$veth" up
}

show_logs() {
  SLURM_CONF=$CONF timeout 5 sinfo -N -l >&2 2>&1
  tail -n 20 "$DIR"/log/*.log "$DIR/munge/munged.log" >&2 2>/dev/null
}

cmd_up() {
  local k=$1 i out idle=0 t0
  probe || exit 3
  check_subnet_free
  teardown
  # (up_built is global: the EXIT trap runs after this function's locals are gone.)
  up_built=0
  trap 'if [ "$up_built" -eq 0 ]; then echo "$self: up failed; daemon logs follow, then the half-built cluster goes" >&2; show_logs; teardown; exit 1; fi' EXIT
  trap 'exit 1' INT TERM HUP
  set -e
  mkdir -p "$DIR"/etc "$DIR"/log "$DIR"/ctld "$DIR"/munge
  chmod 755 "$DIR"
  printf 'prefix=%s\nveth=%s\nbridge=%s\nnet=%s\nnodes=%s\n' \
    "$PREFIX" "$VETH" "$BRIDGE" "$NET" "$k" > "$DIR/config"
  # munge: its own key and socket; clients need only x on the directory to reach the socket.
  chown munge:munge "$DIR/munge"
  chmod 711 "$DIR/munge"
  dd if=/dev/urandom of="$DIR/munge/key" bs=1024 count=1 status=none
  chown munge:munge "$DIR/munge/key"
  chmod 400 "$DIR/munge/key"
  runuser -u munge -- munged --socket "$SOCKET" --key-file "$DIR/munge/key" \
    --pid-file "$DIR/munge/munged.pid" --log-file "$DIR/munge/munged.log" --seed-file "$DIR/munge/seed"
  write_conf "$k"
  ip link add "$BRIDGE" type bridge
  ip addr add "$NET.254/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  add_node "${PREFIX}ctl" "$NET.253"
  for i in $(seq 1 "$k"); do
    add_node "$PREFIX$i" "$NET.$i"
    mkdir -p "$DIR/$PREFIX$i/spool" "$DIR/$PREFIX$i/tmp"
  done
  # slurmctld binds to what its hostname resolves to: its own namespace, hostname = SlurmctldHost.
  start_in "${PREFIX}ctl" slurmctld -f "$CONF" -i
  for i in $(seq 1 "$k"); do start_in "$PREFIX$i" slurmd -f "$CONF" -N "$PREFIX$i"; done
  set +e
  t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$TIMEOUT" ]; do
    idle=$(SLURM_CONF=$CONF sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$')
    [ "$idle" -eq "$k" ] && break
    sleep 0.1
  done
  [ "$idle" -eq "$k" ] || { echo "$self: $idle of $k nodes idle after ${TIMEOUT} s" >&2; exit 1; }
  up_built=1
  trap - EXIT INT TERM HUP
  echo "$self: $k node(s) up: ${PREFIX}[1-$k] at $NET.1-$k, slurmctld ${PREFIX}ctl $NET.253:$PORT" \
    "(bridge $BRIDGE $NET.254, SLURM_CONF=$CONF)" >&2
}

[ $# -ge 1 ] || usage
check_settings
case $1 in
  up)
    { [ $# -eq 2 ] && is_count "$2" 252; } || usage
    cmd_up "$2"
    ;;
  down)
    [ $# -eq 1 ] || usage
    teardown
    exit 0
    ;;
  env)
    [ $# -eq 1 ] || usage
    echo "SLURM_CONF=$CONF"
    ;;
  available)
    [ $# -eq 1 ] || usage
    probe || exit 3
    ;;
  -h | --help | help) usage ;;
  *) usage ;;
esac
