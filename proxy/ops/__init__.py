"""Cross-cutting operations, injected into the fronts: the middleware (`middleware`) with
its auth (`auth`) and browser policy (`origin`), metrics, usage records, per-run tracking,
the response store's backends (`stores` in this process, `redis_store` shared), the
console's feed, and the limits of one process and connection (`descriptors`, `listener`,
`outbound`, `throttle`, `bodies`)."""
