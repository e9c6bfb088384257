"""The browser console: a page served by wsmode itself, and its live feed (README, "Console")."""
