"""The vLLM engine: vLLM as the backbone in its own environment (worker.py), clef's head and job lifecycle."""
