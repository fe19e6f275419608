"""Temperature scaling: fit temperatures on gold labels, apply them, save and load them."""
