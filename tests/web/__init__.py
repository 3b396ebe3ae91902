"""The web view example: its parts, and the page in a real browser."""
