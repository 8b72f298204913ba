#!/usr/bin/env bash
# Issue 37's measurements on an accelerator machine, in one command (docs/accelerators.md,
# "Next on the chip"): each benchmark's output to its own file in FOLDER as it is
# printed (nothing buffered behind a pipe), and the seconds each took, so that a run cut
# off by a time limit still leaves what it measured.
#
#     bash benchmarks/on_device.sh FOLDER [SITE]
#
# SITE: a folder holding tracediff's dependencies, added to the end of PYTHONPATH (the
# machine's own JAX stays first); installed there from the machine's package index when
# it lacks h5py (PIP_OPTIONS: more pip options, e.g. the index to use). ONLY: the steps to
# run, in that order (default: all of them but truths, behind, full and writer_overlap, in the
# order below; truths, issue 37's behaviours against their truths, installs torch's CPU
# build first; behind: the defaults' full level with TRACEDIFF_WRITE_BEHIND=1, beside
# `defaults`; full: the defaults' full level alone; writer_overlap: the same choices on
# the writer alone, no accelerator used; and issues 66 and 68's: nonfinite, where a NaN
# came from, fixtures/jax_nonfinite.py's cases at --level stats on the chip and `info`;
# cache, the program cache cold then warm on the MLP at --level stats, the two traces
# located; loop, the stats loop and whole process against a revision's tracediff,
# `against_revision.py --rev-tree $REV_TREE`, ROUNDS rounds).
set -u
out="${1:?usage: on_device.sh FOLDER [SITE]}"
site="${2:-/tmp/site}"
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out"
if [ ! -d "$site/h5py" ]; then
    python3 -m pip install -q ${PIP_OPTIONS:-} --only-binary=:all: --target "$site" \
        flax optax h5py click rich xxhash > "$out/install.txt" 2>&1
fi
case " ${ONLY:-} " in
*" truths "*)   # the seed's Dense vs Linear needs torch: a CPU build, from the machine's wheels
    if [ ! -d "$site/torch" ]; then
        python3 -m pip install -q ${PIP_OPTIONS:-} --only-binary=:all: --target "$site" \
            torch==2.13.0 --find-links /opt/wheels >> "$out/install.txt" 2>&1
    fi ;;
esac
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
run() {   # name: that step's command
    case "$1" in
    digest_speed) step digest_speed python3 benchmarks/digest_speed.py ;;
    defaults) step defaults python3 benchmarks/accelerator.py --only defaults --levels calls,stats,full ;;
    wide) step wide python3 benchmarks/accelerator.py --only wide --levels calls,stats ;;
    profile) step profile python3 benchmarks/record_profile.py --levels calls,full \
        --extra "--jax-values compiled" ;;
    call_floor) step call_floor python3 benchmarks/jax_call_floor.py --arrays 20 --repeat 1 ;;
    truths) step truths python3 benchmarks/accelerator_truths.py ;;
    behind) step behind env TRACEDIFF_WRITE_BEHIND=1 python3 benchmarks/accelerator.py \
        --only defaults --levels full ;;   # the full level with the chunks written behind
    writer_overlap) step writer_overlap python3 benchmarks/writer_overlap.py ;;
    full) step full python3 benchmarks/accelerator.py --only defaults --levels full ;;
    nonfinite) step nonfinite nonfinite ;;
    cache) step cache cache ;;
    loop) step loop python3 benchmarks/against_revision.py --rev-tree "${REV_TREE:?}" \
        --rounds "${ROUNDS:-3}" --args "--sizes 256,1024,1024,256 --batch 64 --steps 300" ;;
    *) echo "no step $1" >&2; exit 2 ;;
    esac
}
for name in ${ONLY:-digest_speed defaults wide profile call_floor}; do
    run "$name"
done
