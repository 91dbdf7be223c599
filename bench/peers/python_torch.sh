# Sourced by the benchmarks whose peers are Python programs (bench/multiprocessing.sh,
# bench/dataloader.sh): ensure_python_torch WHO installs Debian's python3-torch when the system
# python3 lacks torch (scripts/setup-debian.sh installs it for the torch backend's tests; a machine
# set up before that may lack it), saying WHO asked.
ensure_python_torch() {
  if /usr/bin/python3 -c "import torch" 2>/dev/null; then return; fi
  echo "$1: installing python3-torch (the Python peer's torch)" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
}
