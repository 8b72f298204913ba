"""The vectorised scan: many paired single-output events compared in chunks of bytes, for
locate's tolerance pre-check and the HTML profile, before the exact per-event path.
"""

import numpy as np

from ...trace import schema
from ..compare import values as compare


class ToleranceScan:
    """Chunked, vectorised comparison of many simple pairs (see the module docstring)."""

    FAST_CHUNK_BYTES = 8 << 20   # per side; the float64 temporaries of a chunk whose every
                                 # element differs take ~17x this (kept well under 1 GB)
    FAST_MAX_BYTES = 1 << 20

    def _fast_within_tolerance(self, ia, ib):
        """Vectorised pre-check of many candidate pairs: True where the pair is certainly
        within tolerance (one float output value on each side, same dtype and shape, every
        element within tolerance). Everything else is left to the exact per-event path."""
        if not len(ia) or self.ulp is not None:
            return np.zeros(len(ia), bool)
        done, _, beyond = self.scan_single_outputs(ia, ib, self.FAST_MAX_BYTES,
                                                   self.FAST_CHUNK_BYTES, progress=True)
        return done & ~beyond

    SCAN_DTYPES = ("float64", "float32", "float16", "complex128", "complex64")

    def scan_single_outputs(self, ia, ib, max_bytes, chunk_bytes, progress=False):
        """(done, max_rel, beyond) per pair of (ia, ib), vectorised in chunks: for pairs with
        one float/complex output on each side (same dtype and shape, bytes stored, at most
        `max_bytes`) the max relative difference (`compare/values.py`'s, inf for NaN against a
        number) and whether an element is beyond rtol/atol (not --ulp); `done` False for
        every other pair (the caller's exact per-event path). The one implementation of the
        scan (locate's tolerance pre-check and the HTML profile both use it); only the
        elements whose bits differ are measured."""
        n = len(ia)
        done, beyond = np.zeros(n, bool), np.zeros(n, bool)
        max_rel = np.zeros(n, np.float64)
        sa, sb = self.sa, self.sb
        if not n:
            return done, max_rel, beyond
        simple = (sa.n_out[ia] == 1) & (sb.n_out[ib] == 1) & (sa.kind[ia] != schema.KIND_OPTIM)
        sel = np.flatnonzero(simple)
        if not len(sel):
            return done, max_rel, beyond

        def rows(side, ev):
            keys = side.key(ev, schema.ROLE_OUT, 0)
            pos = np.minimum(np.searchsorted(side.vkey, keys), max(len(side.vkey) - 1, 0))
            found = side.vkey[pos] == keys
            return side.trace.values[side.vrow[pos]], found

        va, fa = rows(sa, ia[sel])
        vb, fb = rows(sb, ib[sel])
        bad_flags = schema.VFLAG_UNINIT | schema.VFLAG_NOT_STORED
        good = fa & fb & (va["offset"] >= 0) & (vb["offset"] >= 0) & \
            ((va["flags"] & bad_flags) == 0) & ((vb["flags"] & bad_flags) == 0) & \
            (sa.gid[va["dtype"]] == sb.gid[vb["dtype"]]) & (sa.gid[va["shape"]] == sb.gid[vb["shape"]]) & \
            (va["nbytes"] == vb["nbytes"]) & (va["nbytes"] > 0) & (va["nbytes"] <= max_bytes)
        dnames = _resolve(self.ta, va["dtype"])
        snames = _resolve(self.ta, va["storage"])
        todo, finished = int(va["nbytes"][good].sum()), 0
        for dt in self.SCAN_DTYPES:
            idx = np.flatnonzero(good & (dnames == dt) & (snames == dt))
            if not len(idx):
                continue
            r, t = compare.tolerance(dt, self.rtol, self.atol)
            item = np.dtype(dt).itemsize
            parts = 2 if dt.startswith("complex") else 1
            ut = {2: np.uint16, 4: np.uint32, 8: np.uint64}[item // parts]
            start = 0
            while start < len(idx):
                nb = va["nbytes"][idx[start:]].astype(np.int64)
                stop = start + max(1, int(np.searchsorted(np.cumsum(nb), chunk_bytes)))
                part = idx[start:stop]
                ra_ = self.ra.gather(va["offset"][part], va["nbytes"][part], va["hash"][part])
                rb_ = self.rb.gather(vb["offset"][part], vb["nbytes"][part], vb["hash"][part])
                xa, xb = ra_.view(dt), rb_.view(dt)
                # only elements whose bits differ are measured (one cheap pass)
                neq = ra_.view(ut) != rb_.view(ut)
                if parts == 2:
                    neq = neq.reshape(-1, 2).any(axis=1)
                nz = np.flatnonzero(neq)
                wide = np.complex128 if parts == 2 else np.float64
                with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                    pa, pb = xa[nz].astype(wide), xb[nz].astype(wide)
                    nan_a, nan_b = np.isnan(pa), np.isnan(pb)
                    equal = (pa == pb) | (nan_a & nan_b)
                    diff = np.abs(pa - pb)
                    scale = np.maximum(np.abs(pa), np.abs(pb))
                    rel = np.where(equal, 0.0, diff / np.where(scale == 0, 1.0, scale))
                    rel = np.where(np.isnan(rel) | (nan_a ^ nan_b), np.inf, rel)
                    out = ~equal & ~(np.isfinite(diff) & (diff <= t + r * scale))
                seg = np.concatenate([[0], np.cumsum(va["nbytes"][part].astype(np.int64) // item)[:-1]])
                k = sel[part]
                full = np.zeros(len(xa), np.float64)
                full[nz] = rel
                max_rel[k] = np.maximum.reduceat(full, seg)
                out_k = np.zeros(len(part), bool)
                out_k[np.searchsorted(seg, nz[out], side="right") - 1] = True
                beyond[k], done[k] = out_k, True
                start = stop
                finished += int(va["nbytes"][part].sum())
                if progress:
                    self._tell("comparing values within tolerance (bytes)", finished, todo)
        return done, max_rel, beyond


def _resolve(trace, idx):
    """Strings of many string-table indices (object array), one lookup per distinct index."""
    uniq, inv = np.unique(np.asarray(idx), return_inverse=True)
    return np.array([trace.string(u) for u in uniq.tolist()] or [""], dtype=object)[inv] \
        if len(uniq) else np.zeros(0, dtype=object)
