# shellcheck shell=bash
# Sourced by scripts that run long, chatty steps (package installation, the build) on behalf of a
# user who only wants the result: each step is one line, its full output goes to a log, and a
# failure names the log and shows its end.
#   source scripts/progress.sh
#   run_step "[2/3] building (release)" build/run-example.log bash scripts/build.sh release

# run_step LABEL LOG COMMAND...: runs COMMAND with stdout and stderr appended to LOG. Prints LABEL
# and, for a build, ninja's [n/N] progress: one updating line on a terminal, a line every 10%
# otherwise (a CI log). When COMMAND fails: says so, naming LOG, prints LOG's last 20 lines (less
# the [n/N] ones) to stderr and exits with COMMAND's status.
run_step() {
  local label=$1 log=$2
  shift 2
  local start=$SECONDS status errexit=0
  [[ $- == *e* ]] && errexit=1
  if [ -t 1 ]; then printf '%s ...' "$label"; else echo "$label ..."; fi
  set +e  # the status is this function's to report
  NINJA_STATUS='[%f/%t] ' "$@" 2>&1 | tee -a "$log" | _show_build_progress "$label"
  status=${PIPESTATUS[0]}
  ((errexit)) && set -e
  [ -t 1 ] && printf '\r\033[K'  # the progress line gives way to the outcome
  if ((status != 0)); then
    {
      echo "$label failed (exit $status): see $log (last lines below)"
      # Without the build's [n/N] lines, the end is the error itself.
      grep -v -E '^\[[0-9]+/[0-9]+\] ' "$log" | tail -n 20 | sed 's/^/  | /'
    } >&2
    exit "$status"
  fi
  echo "$label: done ($((SECONDS - start)) s)"
}

# Reads a command's output and shows the [n/N] of ninja's status lines (NINJA_STATUS as run_step sets it).
_show_build_progress() {
  local label=$1 line finished total percent shown=0
  while IFS= read -r line; do
    [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]] || continue
    finished=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]}
    ((total > 0)) || continue
    percent=$((finished * 100 / total))
    if [ -t 1 ]; then
      printf '\r%s ... %d/%d (%d%%)\033[K' "$label" "$finished" "$total" "$percent"
    elif ((percent >= shown + 10)); then
      shown=$((percent / 10 * 10))
      echo "$label: $percent% ($finished/$total)"
    fi
  done
}
