"""Protocol core tests (issue #2)."""
