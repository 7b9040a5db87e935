"""CUDA graphs: work of a fixed shape captured once and replayed.

A graph replays all the kernels of one capture with a single launch, which is
what a step loop of small kernels needs on a GPU (see `run_graphed_lstm_layer`
in bilm/runtime/kernels.py): there the launches, not the arithmetic, set the pace.
"""

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from .lru import LruCache

Tensors = tuple[torch.Tensor, ...]


@dataclass
class CapturedGraph:
    """One capture of `run(*inputs)`: write the inputs in place, `replay()`,
    read the outputs. Every replay overwrites the outputs: copy what is kept.
    Without a graph, `replay()` calls `run` (the same work, launched
    kernel by kernel: for tests without a GPU)."""

    inputs: Tensors
    run: Callable[..., Tensors]
    graph: "torch.cuda.CUDAGraph | None" = None
    outputs: Tensors = ()

    def replay(self) -> Tensors:
        if self.graph is None:
            self.outputs = self.run(*self.inputs)
        else:
            self.graph.replay()
        return self.outputs


class GraphCache:
    """Graphs by key, captured on first use; at most `max_size` kept (the
    least recently used dropped), all in one memory pool. Sharing the pool is
    safe as they are used here: one replays at a time, and its outputs are
    copied before another replays. capture=False keeps the inputs and runs
    the work at each replay, capturing nothing (tests without a GPU)."""

    def __init__(self, max_size: int = 64, capture: bool = True) -> None:
        self.graphs: LruCache[Hashable, CapturedGraph] = LruCache(max_size)
        self.capture = capture
        self.pool = None

    def __len__(self) -> int:
        return len(self.graphs)

    def get(
        self, key: Hashable, make_inputs: Callable[[], Tensors], run: Callable[..., Tensors]
    ) -> CapturedGraph:
        """The graph of `run(*inputs)` under `key`, captured now if not kept:
        `make_inputs()` allocates the inputs it reads (on the GPU; their
        contents when captured do not matter)."""
        captured = self.graphs.get(key)
        if captured is None:
            inputs = make_inputs()
            captured = self._capture(inputs, run) if self.capture else CapturedGraph(inputs, run)
            self.graphs.put(key, captured)
        return captured

    def _capture(self, inputs: Tensors, run: Callable[..., Tensors]) -> CapturedGraph:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        # One run first, on a side stream, as torch asks: it makes the
        # library handles and workspaces that the capture must not allocate.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = run(*inputs)
        return CapturedGraph(inputs, run, graph, outputs)
