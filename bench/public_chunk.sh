#!/usr/bin/env bash
# One resumable chunk of the public re-mine (issue 17), sized for one device call.
#
#   bash bench/public_chunk.sh [FOLDER...]      (default: every bench/public folder with a kernel)
#
# Carry bench/public (the git-ignored kernels; see bench/public/SOURCES.md), .whl and .state.
# The mine's output (skills, lineages, gate log: they quote public code, so they stay out of
# git) travels between calls as .state/public_mine.tar.xz.part-* (bench/state_archive.sh):
#
#   between calls:  rm -f .state/public_mine.*; cp FILES_AT/public_mine.tar.xz.part-* .state/
#
# An expert whose walk a chunk finished (a mine that exited 0 and wrote report_<folder>.json)
# is skipped by the next chunk; one cut by the chunk's limit resumes from the gate log.
# Then, on any machine: python bench/public_lineages.py --builds build/public_builds \
#   --mined build/public_mine --references
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
# GPU_MATCH (e.g. H200): mine only where the GPU's name holds it (the skills' speed figures are
# the H200's; a call for one may land on another card). Nothing is unpacked or written otherwise.
if [ -n "${GPU_MATCH:-}" ]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  case "$gpu" in
    *"$GPU_MATCH"*) ;;
    *) echo "not a $GPU_MATCH GPU (${gpu:-none found}): no chunk run, the state left as it was"
       exit 3 ;;
  esac
fi
source bench/state_archive.sh
mine=build/public_mine
state_unpack public_mine || mkdir -p "$mine"
mkdir -p "$mine"
folders=("$@")
if [ ${#folders[@]} -eq 0 ]; then
  for d in bench/public/*/; do
    [ -f "$d/kernel.cu" ] && folders+=("${d%/}")
  done
fi
todo=()
for d in "${folders[@]}"; do
  name=$(basename "$d")
  if [ -f "$mine/done_$name" ]; then echo "$name: finished by an earlier chunk"; else todo+=("$d"); fi
done
status=0
deadline=$((SECONDS + ${CHUNK_SECONDS:-540}))
for d in "${todo[@]}"; do
  name=$(basename "$d")
  left=$((deadline - SECONDS))
  [ "$left" -gt 30 ] || break
  rm -f "$mine/exit_$name"
  timeout "$left" bash bench/public_run.sh mine "$mine" "$d"
  code=$(cat "$mine/exit_$name" 2>/dev/null || echo 124)  # none: cut by the chunk's limit
  echo "$name: mine exit $code"
  if [ "$code" = 0 ] && [ -f "$mine/report_$name.json" ]; then
    touch "$mine/done_$name"
  else
    status=$code
  fi
done
state_pack public_mine "$mine"
exit $status
