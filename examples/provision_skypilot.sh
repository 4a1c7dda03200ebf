#!/usr/bin/env bash
# A hotspare provisioner for a cloud through SkyPilot (not run by the tests: it needs a cloud
# account). hotspare runs it as argv, never through a shell:
#
#   [provisioner]
#   command = ["examples/provision_skypilot.sh", "up"]
#   release = ["examples/provision_skypilot.sh", "down"]     # hotspare appends the host's name
#   timeout_s = 900
#   max_hosts = 2
#   idle_release_s = 1800
#
# "up" launches one GPU machine (sky launch, no job), waits until it answers over SSH, and
# prints its [hosts.X] table as one JSON object with its name; "down NAME" tears it down.
# The host key is pinned into the known_hosts hotspare verifies against; hotspare then runs
# its preflight, deploys its bundle there, and adds the host to inventory.toml.
set -euo pipefail

REGION_NAME="${HOTSPARE_REGION:-us-east}"      # the inventory region the host joins
ACCELERATORS="${HOTSPARE_ACCELERATORS:-H100:8}"
KNOWN_HOSTS="${HOTSPARE_KNOWN_HOSTS:-$HOME/.ssh/known_hosts}"

case "${1:-}" in
  up)
    name="hs-$(date +%Y%m%d-%H%M%S)-$RANDOM"
    sky launch --yes --cluster "$name" --gpus "$ACCELERATORS" >&2   # no task: a machine only
    ip="$(sky status --ip "$name")"
    for _ in $(seq 60); do
      ssh-keyscan -T 5 "$ip" >>"$KNOWN_HOSTS" 2>/dev/null && break
      sleep 5
    done
    gpus="${ACCELERATORS##*:}"
    printf '{"name": "%s", "region": "%s", "transport": "ssh", "addresses": ["%s"], "user": "%s", "known_hosts": "%s", "root": "/home/%s/hotspare", "gpus": %s}\n' \
      "$name" "$REGION_NAME" "$ip" "${HOTSPARE_USER:-ubuntu}" "$KNOWN_HOSTS" "${HOTSPARE_USER:-ubuntu}" "$gpus"
    ;;
  down)
    sky down --yes "${2:?down needs the host name}" >&2
    ;;
  *)
    echo "usage: $0 up | down NAME" >&2
    exit 2
    ;;
esac
