"""`clef eval`: how accurate and how well calibrated each question is, as tables and an HTML report."""
