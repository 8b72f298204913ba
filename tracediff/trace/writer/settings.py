"""The writer's tunables: when it flushes (rows, bytes, seconds), the size of its chunks,
and how its bytes reach the disk (fsync, write-behind, early writeback).

The writer's modules read them as `settings.NAME` at each use, so a test or benchmark
sets one here (`monkeypatch.setattr(settings, "FLUSH_ROWS", 8)`) and every part of the
writer sees it; the environment variables are read once, at import.
"""

import os

FLUSH_ROWS = 20_000
FLUSH_BYTES = 64 << 20
# Small values queued for statistics are reduced once their bytes reach this (not at the
# flush): batches that stay in the CPU's cache, and temporaries that malloc reuses. At
# 64 MB a batch's float64 temporaries were fresh pages on every reduction, and first
# touches of fresh pages cost ~30-50 us a page on this VM (the GRU loop at stats:
# 2.8 s of 5.3 in four reductions).
STATS_BATCH_BYTES = 1 << 20
STATS_MEMO_VALUES = 4096   # large values whose statistics are kept by hash (_add_stats)
FIRST_FLUSH_BYTES = 1 << 20
FLUSH_SECONDS = 2.0
CHUNK_ROWS = 8192
CHUNK_BYTES = 1 << 20
RESERVE_BYTES = 3 * CHUNK_BYTES + (1 << 20)  # chunk allocations and metadata of one flush
FSYNC = os.environ.get("TRACEDIFF_FSYNC", "1") != "0"
# 1: the whole blob chunks of a pipelined flush are written by its fsync's thread
# (write-behind, `TraceFile.behind`), not the program's. Unset: on where the host has
# cores to spare for it (the TPU v5e host, 13 cores: `full` 12.5-12.9 ms a step behind,
# 16.2-17.3 in the program's thread); off on fewer (the 2-core VM: 2x slower there, the
# thread and the program took turns), docs/performance.md
WRITE_BEHIND = os.environ.get("TRACEDIFF_WRITE_BEHIND",
                              "1" if (os.cpu_count() or 1) >= 8 else "0") == "1"
# 1: the disk starts writing a large write's bytes as soon as they are in the page cache
# (`_start_writeback`), as `dd oflag=nocache` does, instead of all of a flush's at its
# fsync: the fsync then waits for the last few MB, not for the whole flush after it was
# copied (on the TPU v5e host, copy then fsync took ~2x dd's time for the same bytes)
EARLY_WRITEBACK = os.environ.get("TRACEDIFF_EARLY_WRITEBACK", "1") != "0"
WRITEBACK_BYTES = 8 << 20   # the bytes written behind between two starts of writeback
# A finished trace at most this big is rewritten without the unused tails of its chunks
# (a 3-op script: ~2.2 MB of empty chunk space -> tens of KB); above it the tails are a
# small part of the file and the rewrite would cost more than it saves.
COMPACT_BELOW = 32 << 20
