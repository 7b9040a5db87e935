"""What runs a biLM's network fast and keeps its state: the LSTM kernels and
the one place that chooses among them (`kernels`), the precision it computes
in, what it keeps at inference (`caches`: type encodings, packed weights,
primed states, under one rule: they belong to one version of the weights),
and the state carried across batches (`states`)."""
