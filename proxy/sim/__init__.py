"""The built-in simulated model: a stateless HTTP model server for tests, demos and benchmarks."""
