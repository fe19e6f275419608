"""`clef train-head`: fit a new joint head on stored hidden states, and the held-out gate that must pass."""
