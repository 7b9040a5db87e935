"""What runs a biLM's network fast and keeps its state: kernels and their
choice, precision, inference caches and carried states."""
