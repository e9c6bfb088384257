"""The sans-I/O protocol core.

Nothing in this package touches sockets, event loops, clocks or logging configuration: it
takes bytes and happenings and returns data and actions, so every rule of docs/protocol.md can be
tested synchronously. A test scans these modules with `ast` to keep it that way.
"""
