#!/usr/bin/env bash
# Checks of issues 66 and 68 on an accelerator machine, in one command, each step's output
# to its own file in FOLDER as it is printed (a run cut off by a time limit still leaves
# what it measured):
#   nonfinite  where a NaN came from, fixtures/jax_nonfinite.py's cases recorded at
#              --level stats on the chip (values digested on the device) and `info --json`
#   cache      tracediff's program cache, cold then warm, on the MLP at --level stats: the
#              warm run loads every program, and its trace equals the cold one (locate)
#   loop       the stats loop and whole process against a revision's tracediff
#              (benchmarks/against_revision.py --rev-tree REV_TREE), when REV_TREE is set
#
#     bash benchmarks/chip_checks.sh FOLDER [SITE]
set -u
out="${1:?usage: chip_checks.sh FOLDER [SITE]}"
site="${2:-/tmp/site}"
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out"
if [ ! -d "$site/h5py" ]; then
    PIP_CONFIG_FILE=/dev/null python3 -m pip install -q --isolated --only-binary=:all: \
        --index-url file:///opt/pypi/simple --target "$site" flax optax h5py click rich \
        xxhash > "$out/install.txt" 2>&1
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$site:$root" PYTHONUNBUFFERED=1
cd "$root"
step() {   # name, command...
    local name="$1" start
    shift
    start=$(date +%s)
    "$@" > "$out/$name.txt" 2>&1
    echo "$name: exit $? in $(( $(date +%s) - start )) s" | tee -a "$out/times.txt"
}
nonfinite() {
    for c in sqrt norm half adam rms; do
        python3 -m tracediff record --level stats -o "/tmp/nf_$c.h5" fixtures/jax_nonfinite.py --case "$c" > /dev/null
        python3 -m tracediff info "/tmp/nf_$c.h5" | grep -A3 "first non-finite"
        python3 -m tracediff info --json "/tmp/nf_$c.h5" | python3 -c "import json, sys; d = json.load(sys.stdin)['first_nonfinite']; print('$c', {k: d[k] for k in ('op', 'phase', 'step', 'kind', 'inputs_finite', 'level')})"
    done
}
cache() {
    local mlp="fixtures/jax_mlp.py --sizes 256,1024,1024,256 --batch 64 --steps 30"
    rm -rf /tmp/xla
    for run in cold warm; do
        /usr/bin/time -f "$run: %e s wall" env TRACEDIFF_XLA_CACHE=/tmp/xla python3 -m tracediff record --level stats -o "/tmp/$run.h5" $mlp
        python3 -c "import h5py, json; m = json.loads(h5py.File('/tmp/$run.h5')['manifest'][()]); print('$run', m['frameworks']['jax']['program_cache'])"
    done
    python3 -m tracediff locate /tmp/cold.h5 /tmp/warm.h5 | head -3
}
loop() {
    python3 benchmarks/against_revision.py --rev-tree "$REV_TREE" --rounds "${ROUNDS:-3}" \
        --args "--sizes 256,1024,1024,256 --batch 64 --steps 300"
}
for s in ${ONLY:-nonfinite cache loop}; do
    if [ "$s" = loop ] && [ -z "${REV_TREE:-}" ]; then continue; fi
    step "$s" "$s"
done
