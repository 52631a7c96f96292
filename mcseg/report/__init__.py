"""Cross-run reports: collect runs, aggregate seeds, select by validation, test, render."""
