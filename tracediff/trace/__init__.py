"""The trace file: schema (constants), writer (append-only, chunked), reader (safe, lazy)."""
