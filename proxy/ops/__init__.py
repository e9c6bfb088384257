"""Cross-cutting operations, injected into the fronts: middleware, auth, metrics,
usage records and per-run tracking."""
