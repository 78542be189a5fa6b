# Sourced by the chunk scripts: pack and unpack the state a device call carries between calls.
#
# The device returns files of at most 16 MiB, so a state is written as xz parts of 15 MiB
# ($OUT/NAME.tar.xz.part-00, -01, ...). On 2026-12-04 a gzip state of the replay grew past the
# limit inside one call and the call's verdicts were lost; parts cannot outgrow it.
#
#   state_pack NAME PATH...   # -> $OUT/NAME.tar.xz.part-NN (STATE_PART_BYTES each, default 15m)
#   state_unpack NAME         # .state/NAME.tar.xz.part-* (or an older .state/NAME.tgz); 1 if none
#
# Between calls: rm -f .state/NAME.*; cp FILES_AT/NAME.tar.xz.part-* .state/

state_pack() {
  local name=$1
  shift
  rm -f "$OUT/$name".tar.xz.part-*
  # -T0: every core, so packing a 60 MB state takes seconds of the call, not half a minute
  tar cf - "$@" | xz -T0 | split -b "${STATE_PART_BYTES:-15m}" -d -a 2 - "$OUT/$name.tar.xz.part-"
}

state_unpack() {
  local name=$1
  local parts=(.state/"$name".tar.xz.part-*)
  if [ -f "${parts[0]}" ]; then
    cat "${parts[@]}" | tar xJf -
  elif [ -f ".state/$name.tgz" ]; then
    tar xzf ".state/$name.tgz"
  else
    return 1
  fi
}
