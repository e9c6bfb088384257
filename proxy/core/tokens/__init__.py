"""The token path: token-exact continuation for servers that take token ids (docs/tokens.md)."""
