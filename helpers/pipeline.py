"""A pipeline stage made by the course: one piece of a model, and a record of what it ran when.

Pipeline parallelism (lesson 10) gives each rank one *stage* of a model: a few layers. An
input batch is cut into micro-batches; activations go forward from stage to stage with
``send``/``recv``, and gradients come back the same way. A :class:`Stage` holds the rank's
layers and keeps, for each micro-batch it has run forward, what backward will need (the
*activations*). It records every forward and backward in the order the rank runs them,
and :meth:`Stage.record` merges those steps with the rank's point-to-point calls, read from
the trace, into the rank's *program*: plain data that :class:`helpers.schedule.Schedule`
replays on a logical clock to find the pipeline's exact bubble.

What a schedule does with a stage, on each rank (``i`` is the micro-batch)::

    y = stage.forward(i, x)             # first stage: x is the input micro-batch; others: what arrived
    loss = stage.forward(i, x, target)  # last stage: the micro-batch's loss
    g = stage.backward(i, grad)         # grad: the gradient of the output (last stage: d loss / d loss_i);
                                        # returns the gradient of the input (first stage: None)

Two refinements that schedules past 1F1B use (lesson 10):

- **chunks** (interleaved schedules): a rank may hold several pieces of the model, ``Stage(...,
  chunk=c, num_chunks=v)``; chunk c of rank r is piece ``c * p + r`` of ``v * p``, so activations
  go from rank p - 1's chunk c to rank 0's chunk c + 1. ``is_first``, ``is_last``,
  ``prev_rank`` and ``next_rank`` speak of the pieces. :meth:`Stage.record_all` records a
  rank's chunks together;
- **split backward** (zero-bubble schedules): ``stage.backward_input(i, grad)`` returns the
  input's gradient at once (what the previous stage waits for) and ``stage.backward_weight(i)``
  adds the layers' weight gradients later, in what would otherwise be idle time.

Example (two ranks, in a launch with ``trace=True``)::

    >>> def run(rank, world_size):
    ...     stage = Stage(torch.nn.Linear(3, 3), input_shape=(2, 3), output_shape=(2, 3))
    ...     x = torch.ones(2, 3) if stage.is_first else torch.empty(stage.input_shape)
    ...     if not stage.is_first:
    ...         dist.recv(x, stage.prev_rank)
    ...     y = stage.forward(0, x, target=torch.zeros(2, 3) if stage.is_last else None)
    ...     if not stage.is_last:
    ...         dist.send(y, dst=stage.next_rank)
    ...     return stage.record()
    >>> records = launch(run, 2, trace=True)
    >>> [kind for kind, *_ in records[1]["program"]]
    ['recv', 'forward']
"""

from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["Stage", "StageError"]


class StageError(RuntimeError):
    """A stage was used in a way no schedule can: the message says which call, and what to do."""


def _mean_squared_error(output: Any, target: Any) -> Any:
    import torch.nn.functional as F

    return F.mse_loss(output, target)


class Stage:
    """One rank's stage of a pipeline: its layers, the activations it keeps, and its record.

    ``module`` is this rank's piece of the model; ``input_shape`` and ``output_shape`` the
    shapes of one micro-batch going in and coming out (what to allocate before a ``recv``);
    the last stage turns its output into a loss with ``loss_fn(output, target)`` (mean
    squared error by default). ``rank`` and ``num_stages`` default to the process group's.
    """

    def __init__(self, module: Any, input_shape: tuple, output_shape: tuple, loss_fn: Callable | None = None,
                 *, rank: int | None = None, num_stages: int | None = None, chunk: int = 0,
                 num_chunks: int = 1) -> None:
        import torch.distributed as dist

        self.rank = dist.get_rank() if rank is None else rank
        self.num_stages = dist.get_world_size() if num_stages is None else num_stages
        if not 0 <= chunk < num_chunks:
            raise StageError(f"Stage(chunk={chunk}, num_chunks={num_chunks}): a rank's chunks are numbered 0 to "
                             "num_chunks - 1.")
        self.chunk, self.num_chunks = chunk, num_chunks
        self.piece = chunk * self.num_stages + self.rank  # which piece of the model, of num_chunks * num_stages
        self.is_first = self.piece == 0
        self.is_last = self.piece == num_chunks * self.num_stages - 1
        self.prev_rank = None if self.is_first else (self.rank - 1) % self.num_stages
        self.next_rank = None if self.is_last else (self.rank + 1) % self.num_stages
        self.input_shape, self.output_shape = tuple(input_shape), tuple(output_shape)
        self._module = module
        self._loss_fn = loss_fn or _mean_squared_error
        self._saved: dict[int, tuple[Any, Any]] = {}  # micro-batch -> (input that needs a gradient, output or loss)
        self._weights_due: dict[int, Any] = {}  # micro-batch -> its output's gradient, kept from backward_input
        self._forwarded: set[int] = set()
        self._backwarded: set[int] = set()
        self.steps: list[tuple[str, int, float, float]] = []  # (kind, micro-batch, start, end), perf_counter
        self.alive: list[int] = []  # activations held after each step
        self._born = time.perf_counter()

    @property
    def held(self) -> int:
        """How many micro-batches' activations this stage holds now (run forward, not yet backward)."""
        return len(self._saved)

    def forward(self, microbatch: int, x: Any, target: Any = None) -> Any:
        """Run micro-batch ``microbatch`` through this stage; keep what its backward needs.

        Returns the output activation to send to the next stage (a tensor of
        ``output_shape``), or on the last stage the micro-batch's loss (needs ``target``).
        """
        import torch

        where = f"{self._name}'s forward({microbatch}, ...)"
        if microbatch in self._forwarded:
            raise StageError(f"{where}: micro-batch {microbatch} already went forward through this stage; "
                             "each micro-batch goes forward once per step.")
        self._check_tensor(x, self.input_shape, where, "x")
        if self.is_last and target is None:
            raise StageError(f"{where}: the last stage computes the loss, so pass the micro-batch's target: "
                             "stage.forward(i, x, target).")
        start = time.perf_counter()
        inputs = x if self.is_first else x.detach().requires_grad_(True)  # its gradient goes back to the previous stage
        out = self._module(inputs)
        if self.is_last:
            out = self._loss_fn(out, target)
        self._saved[microbatch] = (None if self.is_first else inputs, out)
        self._forwarded.add(microbatch)
        self._note("forward", microbatch, start)
        return out.detach()

    @property
    def _name(self) -> str:
        return f"stage {self.rank}" + (f" (chunk {self.chunk})" if self.num_chunks > 1 else "")

    def backward(self, microbatch: int, grad: Any) -> Any:
        """Backward of micro-batch ``microbatch``: accumulate the layers' gradients, free its activations.

        ``grad`` is the gradient of the step's loss with respect to this stage's output for
        that micro-batch (what the next stage sent back); on the last stage it is the
        gradient with respect to the micro-batch's loss: a number, 1/m when the step's loss
        is the mean of m micro-batch losses. Returns the gradient with respect to the
        stage's input, to send to the previous stage (None on the first stage).
        """
        import torch

        inputs, out, grad = self._ready_for_backward(microbatch, grad, f"{self._name}'s backward({microbatch}, ...)")
        start = time.perf_counter()
        if out.requires_grad:  # a first stage whose parameters are all frozen has nothing to differentiate
            torch.autograd.backward(out, grad)
        del self._saved[microbatch]  # the activations are freed: this is what 1F1B saves
        self._backwarded.add(microbatch)
        self._note("backward", microbatch, start)
        return None if inputs is None else inputs.grad

    def backward_input(self, microbatch: int, grad: Any) -> Any:
        """The first half of a split backward: the gradient of the stage's input, at once.

        Takes the same ``grad`` as :meth:`backward` and returns what it returns (None on the
        first stage), but adds nothing to the layers' weight gradients yet: call
        :meth:`backward_weight` for this micro-batch later. Until then the stage keeps the
        micro-batch's activations, which the weight gradients need.
        """
        import torch

        inputs, out, grad = self._ready_for_backward(microbatch, grad,
                                                     f"{self._name}'s backward_input({microbatch}, ...)")
        start = time.perf_counter()
        result = None
        if inputs is not None:
            (result,) = torch.autograd.grad(out, inputs, grad, retain_graph=True)
        self._weights_due[microbatch] = grad
        self._backwarded.add(microbatch)
        self._note("backward_input", microbatch, start)
        return result

    def backward_weight(self, microbatch: int) -> None:
        """The second half of a split backward: add micro-batch ``microbatch``'s share to the layers'
        weight gradients, and free its activations (after :meth:`backward_input` of it)."""
        import torch

        if microbatch not in self._weights_due:
            why = ("already had its weight gradients" if microbatch in self._backwarded and microbatch not in
                   self._saved else "has had no backward_input yet")
            raise StageError(f"{self._name}'s backward_weight({microbatch}): micro-batch {microbatch} {why} on this "
                             "stage; call backward_input(i, grad) first, then backward_weight(i), once each.")
        _, out = self._saved[microbatch]
        start = time.perf_counter()
        params = [p for p in self._module.parameters() if p.requires_grad]
        if params:
            torch.autograd.backward(out, self._weights_due.pop(microbatch), inputs=params)
        else:
            self._weights_due.pop(microbatch)
        del self._saved[microbatch]
        self._note("backward_weight", microbatch, start)

    def _ready_for_backward(self, microbatch: int, grad: Any, where: str) -> tuple[Any, Any, Any]:
        """The saved input and output of a micro-batch that may go backward now, and ``grad`` as a tensor."""
        import torch

        if microbatch not in self._saved or microbatch in self._weights_due:
            done = ("already went backward" if microbatch in self._backwarded else "has not gone forward yet")
            raise StageError(f"{where}: micro-batch {microbatch} {done} on this stage; run each micro-batch's "
                             "forward, then its backward, once each.")
        inputs, out = self._saved[microbatch]
        if self.is_last:
            if grad is None or (isinstance(grad, torch.Tensor) and grad.numel() != 1):
                raise StageError(f"{where}: on the last stage grad is the gradient of the step's loss with respect "
                                 "to this micro-batch's loss, one number (1/m when the step's loss is the mean "
                                 f"of m micro-batch losses); got {grad!r}.")
            grad = torch.as_tensor(grad, dtype=out.dtype).reshape(out.shape)
        else:
            self._check_tensor(grad, self.output_shape, where, "grad")
        return inputs, out, grad

    def parameters(self) -> list:
        """This stage's parameters (their ``.grad`` sums every micro-batch's backward)."""
        return list(self._module.parameters())

    def record(self) -> dict[str, Any]:
        """This rank's program: its steps and point-to-point calls in the order it ran them, as plain data.

        Needs the launch's trace (``trace=True``): the calls come from it. Each entry is
        ``("forward", i)``, ``("backward", i)`` (or ``"backward_input"``,
        ``"backward_weight"``), ``("send", peer, tag, nbytes)`` where the send was posted, or
        ``("recv", peer, tag, nbytes)`` where the received data became usable: the end of a
        ``recv``, or the ``wait()`` of an ``irecv``. Times (``"steps"``) are seconds since the
        stage was made, for a wall-clock picture. A rank with several chunks records them
        together with :meth:`record_all`.
        """
        return Stage.record_all([self])

    @staticmethod
    def record_all(stages: list["Stage"]) -> dict[str, Any]:
        """One rank's program from all its chunks (``stages``, all on this rank), as :meth:`record` gives it.

        A step of a rank with several chunks reads ``(kind, i, chunk)``; ``"alive"`` counts the
        micro-batches whose activations the rank held after each step, over all its chunks.
        """
        from ._runtime.instrument import current

        inst = current()
        if inst is None or not inst.tracing:
            raise StageError("Stage.record() reads this rank's sends and receives from the trace: run the "
                             "launch with trace=True.")
        first = stages[0]
        if any(s.rank != first.rank or s.num_chunks != first.num_chunks for s in stages):
            raise StageError("Stage.record_all(stages): pass the chunks of one rank, made with the same num_chunks.")
        chunked = first.num_chunks > 1
        born = min(s._born for s in stages)
        steps = sorted((start, end, kind, mb, s.chunk, held) for s in stages
                       for (kind, mb, start, end), held in zip(s.steps, s.alive))
        entries = [(start, (kind, mb, chunk) if chunked else (kind, mb)) for start, _, kind, mb, chunk, _ in steps]
        for e in inst.events:
            if e.start < born or not (e.is_send or e.is_recv):
                continue
            if e.is_send:
                entries.append((e.start, ("send", e.peer, e.tag, e.nbytes or 0)))
            else:
                entries.append((e.done, ("recv", e.peer, e.tag, e.nbytes or 0)))
        entries.sort(key=lambda item: item[0])  # one thread: the clock orders the calls as they were made
        held_by_chunk, alive = {}, []
        for _, _, _, _, chunk, held in steps:
            held_by_chunk[chunk] = held
            alive.append(sum(held_by_chunk.values()))
        return {
            "rank": first.rank,
            "num_stages": first.num_stages,
            "num_chunks": first.num_chunks,
            "program": [entry for _, entry in entries],
            "steps": [((kind, mb, chunk) if chunked else (kind, mb)) + (start - born, end - born)
                      for start, end, kind, mb, chunk, _ in steps],
            "alive": alive,
            "unfinished": sorted((s.chunk, mb) if chunked else mb for s in stages for mb in s._saved),
        }

    def _note(self, kind: str, microbatch: int, start: float) -> None:
        self.steps.append((kind, microbatch, start, time.perf_counter()))
        self.alive.append(len(self._saved))

    def _check_tensor(self, x: Any, shape: tuple, where: str, name: str) -> None:
        import torch

        if not isinstance(x, torch.Tensor):
            raise StageError(f"{where}: {name} should be a tensor of shape {shape}, got {type(x).__name__}.")
        if tuple(x.shape) != shape:
            raise StageError(f"{where}: {name} has shape {tuple(x.shape)}, but one micro-batch's is {shape}; "
                             "send and receive one micro-batch per message.")
