"""`clef review`: choose and order the records people should label, written for their labeling tool."""
