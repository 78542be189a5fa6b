# Sourced by the mining chunk scripts: unpack the gate log a rerun resumes from, either the
# last chunk's (.state/gatelog.tgz) or the one behind the committed skills_out/.
if [ -f .state/gatelog.tgz ]; then
  tar xzf .state/gatelog.tgz
elif [ -f bench/state/mine_gatelog.tar.xz ] && [ ! -d skills_out/gatelog ]; then
  tar xJf bench/state/mine_gatelog.tar.xz
fi
