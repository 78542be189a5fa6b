# Sourced by the mining chunk scripts: unpack the gate log a rerun resumes from, either the
# last chunk's (.state/gatelog.tar.xz.part-*, or an older .state/gatelog.tgz) or the one behind
# the committed skills_out/.
source bench/state_archive.sh
if state_unpack gatelog; then
  :
elif [ -f bench/state/mine_gatelog.tar.xz ] && [ ! -d skills_out/gatelog ]; then
  tar xJf bench/state/mine_gatelog.tar.xz
fi
