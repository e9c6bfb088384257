"""`wsmode bench`: side-by-side benchmarks of WebSocket mode and the performance targets.

Every scenario runs the real programs as separate processes on loopback (the simulated model,
`wsmode serve`, and `wsmode sidecar` when it exists), drives them with real clients from the
bench process, interleaves its contenders (A B A B ...) and reports medians and ratios.
"""
