"""What runs a biLM's network fast and keeps its state: the choice of LSTM
kernel (`kernels.choose_kernel`) and the kernels, the precision it computes
in, what it keeps at inference (`caches`: type encodings, packed weights,
CUDA graphs, primed states, under one rule: they belong to one version of
the weights), and the state carried across batches (`states`)."""
