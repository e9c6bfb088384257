"""The context window: token counts, truncation, compaction and its sealed items."""
