"""Judging two paired events' outputs: value rows compared (bytes, statistics or per-device
shards), the tolerance an output is held to, and whether only a dtype cast separates them.

`ValueJudgement` is the part of `Differ` (`diff/differ.py`) that says "are these outputs
equal, bitwise or within tolerance?"; results are cached per pair of rows and of events.
"""

import numpy as np

from ...trace import schema
from ...trace.values import has_bytes as comparable, parse_shape
from ..compare import levels as _levels
from ..compare import values as compare
from ..compare.values import BITWISE


class ValueJudgement:
    """Outputs of paired events compared, cached (see the module docstring)."""

    def compare_rows(self, row_a, row_b, tol_dtype=None):
        """Metrics of two value rows; None when either cannot be compared. `tol_dtype`:
        judge by the tolerance of this (less precise) dtype instead of the value's own."""
        if not comparable(row_a) or not comparable(row_b):
            # --level stats/calls: hash first, then statistics (compare/levels.py)
            if _levels.hashed(row_a) and _levels.hashed(row_b):
                return _levels.compare_hashed(self, row_a, row_b, tol_dtype)
            return self._compare_shards(row_a, row_b, tol_dtype)
        key = (int(row_a["offset"]), int(row_b["offset"]), int(row_a["nbytes"]), tol_dtype)
        hit = self._cmp_val.get(key)
        if hit is not None:
            return hit
        sa, sb = self.ta.string, self.tb.string
        da, db = sa(row_a["dtype"]), sb(row_b["dtype"])
        shape_a, shape_b = sa(row_a["shape"]), sb(row_b["shape"])
        if row_a["hash"] == row_b["hash"] and da == db and shape_a == shape_b and \
                _levels.same_hash_function(self.ta, self.tb):   # else: the bytes decide
            r, t = compare.tolerance(tol_dtype or da, self.rtol, self.atol)
            m = {"bitwise_equal": True, "within_tolerance": True, "max_abs": 0.0, "max_rel": 0.0,
                 "max_ulp": 0.0, "mismatch_fraction": 0.0, "beyond_tolerance_fraction": 0.0,
                 "rtol": r, "atol": t}
        else:
            xa, xb = self.ra.read(row_a), self.rb.read(row_b)
            xb_cmp = self.transform_b(row_a, row_b, xa, xb)
            m = compare.compare_arrays(xa, xb_cmp, da, self.rtol, self.atol, tol_dtype=tol_dtype,
                                       ulp=self.ulp)
            if da != db:
                m["dtype_mismatch"] = [da, db]
                m["within_tolerance"] = False if not compare.is_floating(da) else m["within_tolerance"]
                if _cast_only(xa, xb_cmp):
                    m["cast_only"] = True
            m["bitwise_equal"] = bool(da == db and xa.shape == np.asarray(xb_cmp).shape and
                                      np.asarray(xa).tobytes() == np.asarray(xb_cmp).tobytes())
            if m["bitwise_equal"]:
                m["within_tolerance"] = True
        self._cmp_val[key] = m
        return m

    def _compare_shards(self, row_a, row_b, tol_dtype=None):
        """Metrics of a value whose global bytes neither side stored, through the
        per-device shards both stored (a global array spread over several processes:
        each process records only its own shards), paired by device, index and replica;
        None when they do not pair up or a differing shard has no bytes."""
        skip = schema.VFLAG_UNINIT | schema.VFLAG_STATS
        if row_a is None or row_b is None or (int(row_a["flags"]) | int(row_b["flags"])) & skip:
            return None
        if not self.ta.has_devices() or not self.tb.has_devices():
            return None
        same_fn = _levels.same_hash_function(self.ta, self.tb)
        ident = (int(row_a["event"]), int(row_a["slot"]), int(row_a["role"]))
        key = ("shards",) + ident + (int(row_b["event"]), tol_dtype)
        if key in self._cmp_val:
            return self._cmp_val[key]
        da = self.ta.device_values(*ident)
        db = self.tb.device_values(int(row_b["event"]), int(row_b["slot"]), int(row_b["role"]))
        by_key = {(v.device, v.shard, v.replica): v for v in db}
        dtype = self.ta.string(row_a["dtype"])
        ms, m = [], None
        r, t = compare.tolerance(tol_dtype or dtype, self.rtol, self.atol)
        # shards rows only (each has a digest): a device-tied event's own unstored value
        # reads as one copy without a digest, and is not compared
        if da and len(da) == len(db) and all(v.digest for v in da + db) and \
                all((v.device, v.shard, v.replica) in by_key for v in da):
            for v in da:
                w = by_key[(v.device, v.shard, v.replica)]
                if same_fn and v.digest and v.digest == w.digest:
                    ms.append({"bitwise_equal": True, "within_tolerance": True, "max_abs": 0.0,
                               "max_rel": 0.0, "max_ulp": 0.0, "mismatch_fraction": 0.0,
                               "beyond_tolerance_fraction": 0.0, "rtol": r, "atol": t})
                    continue
                xa, xb = v.value(), w.value()
                if (xa is None or xb is None) and not same_fn:   # two functions' digests:
                    ms = None                                      # not compared
                    break
                if xa is None or xb is None:   # digests only (--level stats): undecided
                    shape = self.ta.string(row_a["shape"])
                    one = _levels.stats_metrics(None, None, dtype, dtype, shape, shape, r, t)
                    one["note"] = ("this process's shards differ (digests; their bytes were "
                                   "not stored, --level full stores them)")
                    _levels._counts(self)["stats_undecided"] += 1
                    ms.append(one)
                    continue
                if xa.shape != xb.shape:
                    ms = None
                    break
                one = compare.compare_arrays(xa, xb, dtype, self.rtol, self.atol,
                                             tol_dtype=tol_dtype, ulp=self.ulp)
                one["bitwise_equal"] = xa.tobytes() == xb.tobytes()
                one["within_tolerance"] = one["within_tolerance"] or one["bitwise_equal"]
                ms.append(one)
            if ms:
                m = compare.worst(ms)
                m["bitwise_equal"] = all(x["bitwise_equal"] for x in ms)
                m["shards_only"] = len(ms)
        self._cmp_val[key] = m
        return m

    def transform_b(self, row_a, row_b, xa, xb):
        """Hook for cross-framework comparison (e.g. a transposed weight); identity here."""
        return xb

    def _out_pairs(self, ea, eb):
        """[(key, row_a, row_b)] of the output values of two paired events."""
        ra = self.ta.value_rows(ea, schema.ROLE_OUT)
        rb = self.tb.value_rows(eb, schema.ROLE_OUT)
        return _pair_rows(self.ta, self.tb, ra, rb, by_name=self.sa.kind[ea] == schema.KIND_OPTIM)

    def compare_event(self, ea, eb):
        """Outputs of a paired event: {'bitwise_equal', 'within_tolerance', 'values',
        'metrics', 'compared', 'not_compared'}."""
        key = (ea, eb)
        hit = self._cmp.get(key)
        if hit is not None:
            return hit
        vals, ms, not_compared = [], [], 0
        weak = self._weakest_input_dtype(ea)
        for k, row_a, row_b in self._out_pairs(ea, eb):
            tol_dtype = None
            if weak is not None and row_a is not None:
                own = self.ta.string(row_a["dtype"])
                if compare.is_floating(own) and \
                        compare.tolerance(weak)[0] > compare.tolerance(own)[0]:
                    tol_dtype = weak
            m = self.compare_rows(row_a, row_b, tol_dtype) \
                if row_a is not None and row_b is not None else None
            entry = {"key": k,
                     "a": _vdesc(self.ta, row_a), "b": _vdesc(self.tb, row_b)}
            if m is None:
                not_compared += 1
                entry["compared"] = False
            else:
                entry["compared"] = True
                entry["metrics"] = m
                ms.append(m)
            vals.append(entry)
        bit = all(m["bitwise_equal"] for m in ms)
        tol = all(m["within_tolerance"] for m in ms)
        diff_ms = [m for m in ms if not m["bitwise_equal"]]
        res = {"bitwise_equal": bit, "within_tolerance": tol, "values": vals,
               "metrics": compare.worst(diff_ms or ms) if ms else None,
               "compared": len(ms), "not_compared": not_compared}
        self._cmp[key] = res
        return res

    def cast_only(self, ea, eb):
        """True when the paired outputs differ in dtype and each differing one is exactly
        the other side's value converted to its dtype (a view or copy of a cast input):
        the precision changed, no op computed differently yet (`_cast_only`)."""
        if self.sa.n_out[ea] == 0 or self.sa.content[ea] == self.sb.content[eb]:
            return False
        r = self.compare_event(ea, eb)
        ms = [v["metrics"] for v in r["values"] if v.get("compared")]
        differing = [m for m in ms if not m["bitwise_equal"]]
        return bool(differing) and len(ms) == len(r["values"]) and \
            all(m.get("cast_only") for m in differing)

    def equal_at(self, ea, eb, level):
        r = self.compare_event(ea, eb)
        return r["bitwise_equal"] if level == BITWISE else r["within_tolerance"]


def _cast_only(xa, xb):
    """True when float arrays xa and xb (different dtypes, same shape) are one value in two
    precisions: the more precise one converted to the other's dtype is the other, bitwise."""
    xa, xb = np.asarray(xa), np.asarray(xb)
    if xa.shape != xb.shape or xa.dtype == xb.dtype or xa.dtype.kind not in "fV" or \
            xb.dtype.kind not in "fV":
        return False
    wide, narrow = (xa, xb) if xa.dtype.itemsize >= xb.dtype.itemsize else (xb, xa)
    try:
        with np.errstate(all="ignore"):
            return wide.astype(narrow.dtype).tobytes() == narrow.tobytes()
    except (TypeError, ValueError):
        return False


def _pair_rows(ta, tb, ra, rb, by_name):
    """Pair two lists of value rows by slot (or by name)."""
    if by_name:
        ka = [ta.string(r["name"]) if r["name"] >= 0 else f"#{int(r['slot'])}" for r in ra]
        kb = [tb.string(r["name"]) if r["name"] >= 0 else f"#{int(r['slot'])}" for r in rb]
    else:
        ka = [int(r["slot"]) for r in ra]
        kb = [int(r["slot"]) for r in rb]
    db = dict(zip(kb, rb))
    out = []
    seen = set()
    for k, r in zip(ka, ra):
        out.append((k, r, db.get(k)))
        seen.add(k)
    for k, r in zip(kb, rb):
        if k not in seen:
            out.append((k, None, r))
    return out


def _vdesc(t, row):
    if row is None:
        return None
    return {"slot": int(row["slot"]), "name": t.string(row["name"]) if row["name"] >= 0 else None,
            "dtype": t.string(row["dtype"]), "shape": list(parse_shape(t.string(row["shape"]))),
            "stored": bool(comparable(row)),
            "uninitialized": bool(row["flags"] & schema.VFLAG_UNINIT)}
