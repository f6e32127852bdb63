#!/usr/bin/env bash
# The noisy-neighbour bench's rows (issue 38): the same tenants against three fleets, one
# after another, each reported by benches/noisy_neighbour.sh with its targets:
#   kv      a KV-bound fleet (its defaults: a small KV pool, no slot limit)
#   slots   a slot-bound fleet: 16 running requests per engine, plenty of KV
#           (MAX_RUNNING=16 KV_TOKENS=262144), the way SGLang with --max-running-requests
#           saturates when prompts are short
#   cold    the KV-bound fleet with the light tenant arriving 10 s after the flood started
#           (LIGHT_LEAD=-10: a cold newcomer without history; the `today` phase skipped)
# Env as for noisy_neighbour.sh (DURATION, KVGATE_BIN, ...); ROWS picks rows (default all).
#
#   DURATION=30 bash benches/noisy_neighbour_rows.sh
#   ROWS="slots cold" KVGATE_BIN=/path/to/kvgate bash benches/noisy_neighbour_rows.sh
#
# Not part of `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
for row in ${ROWS:-kv slots cold}; do
  echo "=== row: $row ==="
  case "$row" in
    kv) bash benches/noisy_neighbour.sh ;;
    slots) MAX_RUNNING=16 KV_TOKENS=262144 bash benches/noisy_neighbour.sh ;;
    cold) LIGHT_LEAD=-10 SKIP_TODAY=1 bash benches/noisy_neighbour.sh ;;
    *) echo "unknown row $row (kv, slots, cold)"; exit 2 ;;
  esac
done
