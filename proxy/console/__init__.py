"""The browser console: a page served by wsmode itself, and its live feed (docs/console.md)."""
