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
# Exit: the gate's 0 pass / 1 fail / 2 inconclusive; 2 also when the gate could not run,
# with the reason on stderr: the Job's pod refused by admission (the Job's `FailedCreate`
# Event, e.g. `pods "…" is forbidden: violates PodSecurity …` or `exceeded quota`) or
# unschedulable (its `PodScheduled` condition, the scheduler's `0/N nodes are available:
# …`) for --start-grace seconds; the prober's image not pulled for --pull-grace; the
# container config refused; the Job failed without a terminated container; --timeout
# passed; any other exit code such as 137 from activeDeadlineSeconds. The Job is left in
# place for inspection (its ttlSecondsAfterFinished removes it); when its pod never
# started it is also suspended (`spec.suspend: true`), so it cannot start a gate later
# that nobody reads. A line every 60 s says what the pod is waiting for.
#
# Options (environment fallback in brackets):
#   -k DIR            kustomization to apply [FIRSTPACKET_GATE_KUSTOMIZATION] (manifests/overlays/gate)
#   -n NAMESPACE      namespace of the Job [FIRSTPACKET_GATE_NAMESPACE] (firstpacket)
#   --job NAME        Job name [FIRSTPACKET_GATE_JOB] (firstpacket-gate)
#   --report FILE     where the JSON report goes [FIRSTPACKET_GATE_REPORT] (firstpacket-report.json)
#   --junit FILE      where the JUnit XML goes, when the gate printed one [FIRSTPACKET_GATE_JUNIT] (firstpacket-junit.xml)
#   --image-registry REGISTRY
#                     run the images pushed to REGISTRY (e.g. registry.example.com/firstpacket):
#                     REGISTRY/prober for the Job and REGISTRY/target-server for the probe
#                     pods (FIRSTPACKET_IMAGE), each with the tag the manifests name
#                     [FIRSTPACKET_IMAGE_REGISTRY] ("": the manifests' ghcr.io/firstpacket names)
#   --timeout SECS    give up waiting [FIRSTPACKET_GATE_WAIT] (960: the Job's activeDeadlineSeconds + 60)
#   --pull-grace SECS how long an image pull error may last [FIRSTPACKET_GATE_PULL_GRACE] (60)
#   --start-grace SECS how long the Job's pod may stay refused by admission or
#                     unschedulable [FIRSTPACKET_GATE_START_GRACE] (10; raise it where a
#                     cluster autoscaler adds nodes for pending pods)
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
start_grace="${FIRSTPACKET_GATE_START_GRACE:-10}"
registry="${FIRSTPACKET_IMAGE_REGISTRY:-}"

# Usage on stdout, exit 0 for --help; on stderr, exit 2 after a bad argument.
help_text() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
usage() { help_text >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    -k) dir=$2; shift 2 ;;
    -n|--namespace) ns=$2; shift 2 ;;
    --job) job=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    --junit) junit=$2; shift 2 ;;
    --image-registry) registry=$2; shift 2 ;;
    --timeout) wait_secs=$2; shift 2 ;;
    --pull-grace) pull_grace=$2; shift 2 ;;
    --start-grace) start_grace=$2; shift 2 ;;
    -h|--help) help_text; exit 0 ;;
    *) echo "gate-job: unknown argument $1" >&2; usage ;;
  esac
done
for n in "$wait_secs" "$pull_grace" "$start_grace"; do
  case "$n" in ''|*[!0-9]*) echo "gate-job: --timeout, --pull-grace and --start-grace take whole seconds, got '$n'" >&2; exit 2 ;; esac
done
case "$registry" in
  */*:*|*/*@*|*/|*' '*) echo "gate-job: --image-registry takes HOST[:PORT][/PATH] without a tag or a trailing /, got '$registry'" >&2; exit 2 ;;
esac

log() { echo "gate-job: $*" >&2; }
inconclusive() { log "$*: exit 2 (inconclusive; Job $ns/$job left for inspection)"; exit 2; }
# The Job's pod never started: suspend the Job (its controller deletes a pending pod and
# creates no more), so it cannot run a gate later that nobody reads; then exit 2.
not_started() {
  kubectl -n "$ns" patch job "$job" --type merge -p '{"spec":{"suspend":true}}' >/dev/null 2>&1 \
    && log "Job $ns/$job suspended" || log "could not suspend Job $ns/$job"
  inconclusive "$*"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --image-registry: a kustomization on top of DIR moving both images to the registry,
# with the tag image.sh gives them (the workspace version, which the manifests name).
if [ -n "$registry" ]; then
  tag=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/Cargo.toml" | head -n 1)
  [ -n "$tag" ] || { log "no workspace version in $here/Cargo.toml"; exit 2; }
  rel=$(realpath --relative-to="$work" "$dir")
  cat > "$work/kustomization.yaml" <<EOF
resources:
- $rel
images:
- {name: ghcr.io/firstpacket/prober, newName: $registry/prober}
patches:
- target: {kind: Job, name: $job}
  patch: |-
    - op: add
      path: /spec/template/spec/containers/0/env/-
      value: {name: FIRSTPACKET_IMAGE, value: "$registry/target-server:$tag"}
EOF
  log "images from $registry: $registry/prober, $registry/target-server:$tag"
  dir="$work"
fi

kubectl -n "$ns" delete job "$job" --ignore-not-found --wait=true >/dev/null
kubectl apply -k "$dir" >&2
uid=$(kubectl -n "$ns" get job "$job" -o 'jsonpath={.metadata.uid}')
[ -n "$uid" ] || inconclusive "Job $ns/$job not found after kubectl apply -k $dir"
log "Job $ns/$job (uid $uid) applied; waiting for its pod to finish"

# The newest message of the Job's FailedCreate Events (the Job controller's "Error
# creating: pods … is forbidden: …" when admission refuses its pod), "" when none or
# when Events cannot be read.
refusal() {
  kubectl -n "$ns" get events --field-selector "involvedObject.uid=$uid,reason=FailedCreate" -o \
    'jsonpath={range .items[*]}{.lastTimestamp}{.eventTime}{" "}{.message}{"\n"}{end}' 2>/dev/null \
    | sort | tail -n 1 | cut -d' ' -f2- || true
}

# One field of the current pod (a jsonpath), "" when it cannot be read.
message() { kubectl -n "$ns" get pod "$pod" -o "jsonpath=$1" 2>/dev/null || true; }

start=$(date +%s)
pull_since=""
refused_since=""
unsched_since=""
said=$start
pod=""
code=""
while :; do
  now=$(date +%s)
  [ $((now - start)) -lt "$wait_secs" ] || inconclusive "the gate did not finish within ${wait_secs}s"
  # name|exit code|waiting reason|phase|PodScheduled reason of each of the Job's pods
  rows=$(kubectl -n "$ns" get pods -l "batch.kubernetes.io/controller-uid=$uid" -o \
    'jsonpath={range .items[*]}{.metadata.name}{"|"}{.status.containerStatuses[0].state.terminated.exitCode}{"|"}{.status.containerStatuses[0].state.waiting.reason}{"|"}{.status.phase}{"|"}{.status.conditions[?(@.type=="PodScheduled")].reason}{"\n"}{end}')
  status=""
  while IFS='|' read -r name exit_code reason phase sched; do
    [ -n "$name" ] || continue
    pod=$name
    if [ -n "$exit_code" ]; then code=$exit_code; break; fi
    status="pod $pod ${phase:-Pending}${reason:+ ($reason)}"
    case "$reason" in
      ErrImagePull|ImagePullBackOff|InvalidImageName)
        pull_since=${pull_since:-$now}
        [ $((now - pull_since)) -lt "$pull_grace" ] \
          || not_started "pod $pod cannot pull the prober's image ($reason: $(message '{.status.containerStatuses[0].state.waiting.message}'))"
        ;;
      CreateContainerConfigError|CreateContainerError)
        not_started "pod $pod cannot start ($reason: $(message '{.status.containerStatuses[0].state.waiting.message}'))"
        ;;
      *) pull_since="" ;;
    esac
    if [ "$sched" = Unschedulable ]; then
      msg=$(message '{.status.conditions[?(@.type=="PodScheduled")].message}')
      status="pod $pod unschedulable: $msg"
      if [ -z "$unsched_since" ]; then
        unsched_since=$now
        log "$status (giving up after ${start_grace}s)"
      fi
      [ $((now - unsched_since)) -lt "$start_grace" ] || not_started "pod $pod is unschedulable: $msg"
    else
      unsched_since=""
    fi
  done <<< "$rows"
  [ -z "$code" ] || break
  failed=$(kubectl -n "$ns" get job "$job" -o 'jsonpath={.status.conditions[?(@.type=="Failed")].reason}')
  if [ -z "$rows" ]; then
    [ -z "$failed" ] || inconclusive "Job failed ($failed) without a pod that ran"
    # No pod: refused by admission (quota, Pod Security, a webhook) or not created yet.
    msg=$(refusal)
    if [ -n "$msg" ]; then
      status="the Job's pod is refused: $msg"
      if [ -z "$refused_since" ]; then
        refused_since=$now
        log "$status (giving up after ${start_grace}s)"
      fi
      [ $((now - refused_since)) -lt "$start_grace" ] || not_started "the Job's pod was refused: $msg"
    else
      status="no pod of the Job yet"
    fi
  else
    refused_since=""
  fi
  if [ $((now - said)) -ge 60 ]; then
    log "still waiting after $((now - start))s: $status"
    said=$now
  fi
  sleep 1
done

# The log: everything outside the framed blocks to stdout, each block to its file.
logfile="$work/log"
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
