"""Diff two traces: align events (align), compare values (compare), locate the origin."""
