"""Alignment when a region is too different for one diff (issue 16, item 4): module
boundaries are anchored first and each pair of modules diffed inside, instead of pairing
events by position. Measured on the real cross-version pair (the GRU example under JAX
0.7.2 and this JAX) with its call and optimizer anchors taken away, so the whole run is
one region of a few thousand events with hundreds of edits."""

import dataclasses

import numpy as np
import pytest

from tracediff.diff.align import sequence as align
from tracediff.trace import schema
from tracediff.trace.reader import Trace


@pytest.fixture(scope="module")
def sides(two_jax_versions):
    old, new = two_jax_versions
    with Trace(old) as ta, Trace(new) as tb:
        strings = align.StringIds()
        yield align.prepare(ta, strings), align.prepare(tb, strings)


def _flat(side, ns=True):
    """The side as one region: no calls or optimizer steps to anchor on (without `ns`: no
    module paths, and no second pass over the gaps either: pairing by position alone)."""
    return dataclasses.replace(side, kind=np.full(len(side.kind), schema.KIND_OP),
                               ns=side.ns if ns else None, lsig=side.lsig if ns else None)


def test_a_region_too_different_for_one_diff_is_aligned_by_module_first(sides):
    sa, sb = sides
    anchored = align.align(sa, sb)
    assert anchored.fallback_regions == 0
    # one region, a small edit cap: more edits than one diff may make
    small = 50
    flat = align.align(_flat(sa), _flat(sb), max_edits=small)
    by_position = align.align(_flat(sa, False), _flat(sb, False), max_edits=small)
    assert by_position.fallback_regions == 1
    matched, positional = int((flat.a2b >= 0).sum()), int((by_position.a2b >= 0).sum())
    assert matched > 2 * positional and matched > 0.8 * int((anchored.a2b >= 0).sum())
    # every event it pairs is paired as the anchored alignment pairs it, in order
    m = np.flatnonzero(flat.a2b >= 0)
    assert np.array_equal(flat.a2b[m], anchored.a2b[m])
    assert np.all(np.diff(flat.a2b[m]) > 0)
    assert np.array_equal(flat.b2a[flat.a2b[m]], m)


def test_module_blocks_pair_only_equal_signatures_and_stay_in_the_budget(sides):
    sa, sb = sides
    budget = align.Budget(pool=0)      # nothing beyond each diff's linear allowance
    pa, pb, _ = align.align_blocks(sa.sig, sb.sig, sa.ns, sb.ns, 50, budget)
    assert len(pa) and np.all(sa.sig[pa] == sb.sig[pb])
    assert np.all(np.diff(pa) > 0) and np.all(np.diff(pb) > 0)
    assert budget.pool == 0
    # no module structure (one module path throughout): nothing to anchor on
    one = np.zeros(len(sa.sig), np.int64)
    assert align.align_blocks(sa.sig, sb.sig, one, np.zeros(len(sb.sig), np.int64)) is None


def test_every_matched_anchor_is_paired_the_first_too(sides):
    """The anchors (calls, optimizer steps) that the anchor diff matches are paired by the
    anchor pass itself, the first one included, with the anchor of b it matched: the
    regions between them are aligned inside those bounds. (The gap pass, `refine_gaps`,
    would pair a first anchor left out by its loose signature and hide the slip; without
    loose signatures there is no gap pass.)"""
    sa, sb = sides
    anc_a = np.flatnonzero(np.isin(sa.kind, align.ANCHOR_KINDS))
    anc_b = np.flatnonzero(np.isin(sb.kind, align.ANCHOR_KINDS))
    pa, pb, _ = align.align_arrays(sa.sig[anc_a], sb.sig[anc_b])
    assert len(pa) > 1 and pa[0] == pb[0] == 0
    for al in (align.align(dataclasses.replace(sa, lsig=None), dataclasses.replace(sb, lsig=None)),
               align.align(sa, sb)):
        assert al.anchors_matched == len(pa)
        assert np.array_equal(al.a2b[anc_a[pa]], anc_b[pb])
        assert np.array_equal(al.b2a[anc_b[pb]], anc_a[pa])
