#!/usr/bin/env bash
# Runs the firstpacket gate in the cluster as the Job of manifests/overlays/gate and exits
# with the gate's own exit code, for CI: a Job's status tells only Complete from Failed,
# and exit 1 (a threshold breached) and exit 2 (inconclusive) both fail it, so this reads
# the container's `state.terminated.exitCode` instead.
#
#   bash scripts/gate-job.sh                                # apply, wait, print, exit 0/1/2
#   bash scripts/gate-job.sh -k my-overlay --report after.json --junit after.xml
#
# Steps: delete the previous Job of that name (Jobs are immutable) → `kubectl apply -k
# DIR` → wait for the Job's pod (by the Job's controller-uid) to terminate → print its log
# without the framed blocks → write the blocks the gate printed with `--report -` (and
# `--junit -`) to --report / --junit → exit with the container's exit code.
#
# Exit: the gate's 0 pass / 1 fail / 2 inconclusive; 2 also when the gate could not run
# (the prober's image cannot be pulled for --pull-grace, the container config is refused,
# the Job failed without a terminated container, --timeout passed, any other exit code
# such as 137 from activeDeadlineSeconds), with the reason on stderr. The Job is left in
# place for inspection (its ttlSecondsAfterFinished removes it).
#
# Options (environment fallback in brackets):
#   -k DIR            kustomization to apply [FIRSTPACKET_GATE_KUSTOMIZATION] (manifests/overlays/gate)
#   -n NAMESPACE      namespace of the Job [FIRSTPACKET_GATE_NAMESPACE] (firstpacket)
#   --job NAME        Job name [FIRSTPACKET_GATE_JOB] (firstpacket-gate)
#   --report FILE     where the JSON report goes [FIRSTPACKET_GATE_REPORT] (firstpacket-report.json)
#   --junit FILE      where the JUnit XML goes, when the gate printed one [FIRSTPACKET_GATE_JUNIT] (firstpacket-junit.xml)
#   --timeout SECS    give up waiting [FIRSTPACKET_GATE_WAIT] (960: the Job's activeDeadlineSeconds + 60)
#   --pull-grace SECS how long an image pull error may last [FIRSTPACKET_GATE_PULL_GRACE] (60)
# kubectl uses KUBECONFIG / the current context as usual.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
dir="${FIRSTPACKET_GATE_KUSTOMIZATION:-$here/manifests/overlays/gate}"
ns="${FIRSTPACKET_GATE_NAMESPACE:-firstpacket}"
job="${FIRSTPACKET_GATE_JOB:-firstpacket-gate}"
report="${FIRSTPACKET_GATE_REPORT:-firstpacket-report.json}"
junit="${FIRSTPACKET_GATE_JUNIT:-firstpacket-junit.xml}"
wait_secs="${FIRSTPACKET_GATE_WAIT:-960}"
pull_grace="${FIRSTPACKET_GATE_PULL_GRACE:-60}"

usage() { sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    -k) dir=$2; shift 2 ;;
    -n|--namespace) ns=$2; shift 2 ;;
    --job) job=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    --junit) junit=$2; shift 2 ;;
    --timeout) wait_secs=$2; shift 2 ;;
    --pull-grace) pull_grace=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "gate-job: unknown argument $1" >&2; usage ;;
  esac
done
for n in "$wait_secs" "$pull_grace"; do
  case "$n" in ''|*[!0-9]*) echo "gate-job: --timeout and --pull-grace take whole seconds, got '$n'" >&2; exit 2 ;; esac
done

log() { echo "gate-job: $*" >&2; }
inconclusive() { log "$*: exit 2 (inconclusive; Job $ns/$job left for inspection)"; exit 2; }

kubectl -n "$ns" delete job "$job" --ignore-not-found --wait=true >/dev/null
kubectl apply -k "$dir" >&2
uid=$(kubectl -n "$ns" get job "$job" -o 'jsonpath={.metadata.uid}')
[ -n "$uid" ] || inconclusive "Job $ns/$job not found after kubectl apply -k $dir"
log "Job $ns/$job (uid $uid) applied; waiting for its pod to finish"

start=$(date +%s)
pull_since=""
pod=""
code=""
while :; do
  now=$(date +%s)
  [ $((now - start)) -lt "$wait_secs" ] || inconclusive "the gate did not finish within ${wait_secs}s"
  # name|exit code|waiting reason|waiting message of each of the Job's pods
  rows=$(kubectl -n "$ns" get pods -l "batch.kubernetes.io/controller-uid=$uid" -o \
    'jsonpath={range .items[*]}{.metadata.name}{"|"}{.status.containerStatuses[0].state.terminated.exitCode}{"|"}{.status.containerStatuses[0].state.waiting.reason}{"|"}{.status.containerStatuses[0].state.waiting.message}{"\n"}{end}')
  while IFS='|' read -r name exit_code reason message; do
    [ -n "$name" ] || continue
    pod=$name
    if [ -n "$exit_code" ]; then code=$exit_code; break; fi
    case "$reason" in
      ErrImagePull|ImagePullBackOff|InvalidImageName)
        pull_since=${pull_since:-$now}
        [ $((now - pull_since)) -lt "$pull_grace" ] || inconclusive "pod $pod cannot pull the prober's image ($reason: $message)"
        ;;
      CreateContainerConfigError|CreateContainerError)
        inconclusive "pod $pod cannot start ($reason: $message)"
        ;;
      *) pull_since="" ;;
    esac
  done <<< "$rows"
  [ -z "$code" ] || break
  failed=$(kubectl -n "$ns" get job "$job" -o 'jsonpath={.status.conditions[?(@.type=="Failed")].reason}')
  if [ -n "$failed" ] && [ -z "$rows" ]; then
    inconclusive "Job failed ($failed) without a pod that ran"
  fi
  sleep 1
done

# The log: everything outside the framed blocks to stdout, each block to its file.
logfile=$(mktemp)
trap 'rm -f "$logfile"' EXIT
kubectl -n "$ns" logs "$pod" > "$logfile" || log "could not read the log of pod $pod"
awk -v report="$report" -v junit="$junit" '
  /^===== BEGIN firstpacket report\.json =====$/ { out = report; printf "" > out; next }
  /^===== BEGIN firstpacket junit\.xml =====$/ { out = junit; printf "" > out; next }
  /^===== END firstpacket (report\.json|junit\.xml) =====$/ { close(out); out = ""; next }
  out != "" { print > out; next }
  { print }
' "$logfile"
grep -q '^===== END firstpacket report\.json =====$' "$logfile" && log "report written to $report" \
  || log "the gate printed no complete report (args without --report -?)"
grep -q '^===== END firstpacket junit\.xml =====$' "$logfile" && log "JUnit written to $junit"

case "$code" in
  0|1|2) log "pod $pod: the gate exited $code"; exit "$code" ;;
  *) inconclusive "pod $pod: the container exited $code (not the gate's own 0/1/2: killed, out of memory, or activeDeadlineSeconds)" ;;
esac
