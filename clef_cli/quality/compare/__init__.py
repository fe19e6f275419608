"""`clef compare`: how two scored files of the same records differ (flips, PSI, JS, confidence)."""
