# shellcheck shell=bash disable=SC2153  # PREFIX, VETH, BRIDGE, NET, DIR: set by the sourcing script
# Sourced by tests/support/netns-cluster.sh and tests/support/slurm-cluster.sh: the checks of their
# network settings, the probe of what a cluster of network namespaces needs, and the names they
# own. The sourcing script sets self, PREFIX, VETH, BRIDGE, NET, DIR, KNOB (its settings' prefix:
# NODAL_NETNS or NODAL_SLURM) and SUFFIX (a regex of its namespaces' and veths' name endings).

# shellcheck disable=SC2154  # self: set by the sourcing script
die() { echo "$self: $*" >&2; exit 1; }

# is_count S MAX: S is a decimal integer in 1..MAX.
is_count() {
  case $1 in '' | *[!0-9]* | 0*) return 1 ;; esac
  [ "${#1}" -le 5 ] && [ "$1" -le "$2" ]
}

# check_net_settings EXAMPLE: NET (three octets, like EXAMPLE), VETH, BRIDGE and DIR.
check_net_settings() {
  case $NET in
    *[!0-9.]* | .* | *. | *..*) die "${KNOB}_NET must be three octets like $1, not '$NET'" ;;
  esac
  [ "$(echo "$NET" | tr -cd . | wc -c)" -eq 2 ] || die "${KNOB}_NET must be three octets like $1, not '$NET'"
  # Interface names: at most 15 characters; the veth's number takes up to 3.
  [ "${#VETH}" -le 12 ] || die "${KNOB}_VETH '$VETH' too long (12 characters at most)"
  [ "${#BRIDGE}" -le 15 ] || die "${KNOB}_BRIDGE '$BRIDGE' too long (15 characters at most)"
  case $DIR in /*) ;; *) die "${KNOB}_DIR must be an absolute path, not '$DIR'" ;; esac
  [ "$DIR" != / ] || die "${KNOB}_DIR must not be /"
}

# probe_netns CMD...: can this machine make a network namespace, run `CMD... NAMESPACE` for it,
# put one end of a veth pair in it and make a bridge? Prints why not on stderr and returns 3;
# leaves nothing behind.
probe_netns() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "$self: needs root (network namespaces, veths, a bridge); running as uid $(id -u)" >&2
    return 3
  fi
  if ! command -v ip >/dev/null 2>&1; then
    echo "$self: no 'ip' command (iproute2)" >&2
    return 3
  fi
  local ns="nodal-probe-$$" va="nodalpa$$" br="nodalpbr$$" out rc=0
  va=${va:0:15}
  br=${br:0:15}
  if ! out=$(ip netns add "$ns" 2>&1); then
    echo "$self: 'ip netns add' does not work here: $out" >&2
    return 3
  fi
  if ! out=$("$@" "$ns" 2>&1); then
    echo "$self: '$*' in a network namespace does not work here: $out" >&2
    rc=3
  elif ! out=$(ip link add "$va" type veth peer name eth0 netns "$ns" 2>&1); then
    echo "$self: cannot make a veth pair into a namespace: $out" >&2
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

# check_subnet_free: no interface but BRIDGE has an address in NET.0/24 (it would take the traffic).
check_subnet_free() {
  local out
  out=$(ip -o -4 addr show 2>/dev/null | awk -v b="$BRIDGE" '$2 != b {print $2, $4}' | grep -F " $NET." || true)
  [ -z "$out" ] || die "subnet $NET.0/24 is already in use here ($out); set ${KNOB}_NET"
}

re() { printf '%s' "$1" | sed 's/[][\.*^$+?(){}|]/\\&/g'; }
# Namespaces and root-side veths the script may have made, by name pattern: those of the
# settings in effect and those of $1 (an alternation: the last 'up's, from DIR/config).
our_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^($(re "$PREFIX")${1:+|$1})${SUFFIX}$"
}
our_veths() {
  ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' \
    | grep -E "^($(re "$VETH")${1:+|$1})${SUFFIX}$"
}

# teardown_cluster OUTSIDE: kills what runs in the namespaces (those of the settings in effect and
# of DIR/config's prefix=, veth=, bridge=, the last 'up's) and the processes OUTSIDE prints (pids,
# a line each: the cluster's launchers and daemons in the root namespace), TERM first, KILL what
# is left after a second; then removes the veths, namespaces, bridge and DIR. Quiet, whatever is there.
teardown_cluster() {
  set +e
  local outside=$1 old_prefix="" old_veth="" old_bridge="" prefix_re="" veth_re="" namespaces ns veth i
  if [ -f "$DIR/config" ]; then
    old_prefix=$(sed -n 's/^prefix=//p' "$DIR/config")
    old_veth=$(sed -n 's/^veth=//p' "$DIR/config")
    old_bridge=$(sed -n 's/^bridge=//p' "$DIR/config")
  fi
  [ -n "$old_prefix" ] && [ "$old_prefix" != "$PREFIX" ] && prefix_re=$(re "$old_prefix")
  [ -n "$old_veth" ] && [ "$old_veth" != "$VETH" ] && veth_re=$(re "$old_veth")
  namespaces=$(our_namespaces "$prefix_re")
  local -a pids
  for i in 1 2 3 4 5 6 7 8 9 10 11; do
    pids=()
    for ns in $namespaces; do
      mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$ns" 2>/dev/null)
    done
    mapfile -t -O "${#pids[@]}" pids < <("$outside")
    [ "${#pids[@]}" -gt 0 ] || break
    if [ "$i" -eq 1 ]; then
      kill -TERM "${pids[@]}" 2>/dev/null
    elif [ "$i" -ge 6 ]; then
      kill -KILL "${pids[@]}" 2>/dev/null
    fi
    sleep 0.2
  done
  # The root-side ends first: deleting a namespace frees its devices only once nothing holds it.
  for veth in $(our_veths "$veth_re"); do ip link del "$veth" >/dev/null 2>&1; done
  for ns in $namespaces; do ip netns del "$ns" >/dev/null 2>&1; done
  ip link del "$BRIDGE" >/dev/null 2>&1
  [ -n "$old_bridge" ] && [ "$old_bridge" != "$BRIDGE" ] && ip link del "$old_bridge" >/dev/null 2>&1
  rm -rf "$DIR"
  return 0
}
