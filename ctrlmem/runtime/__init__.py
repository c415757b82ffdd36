"""Real execution of ctrlmem schedules on ``torch.distributed.pipelining`` (imports torch).

Import explicitly (``import ctrlmem.runtime``); ``import ctrlmem`` never imports torch.

* :mod:`.adapter`: the only module using torch's private pipelining API; Schedule → torch actions;
  the supported torch range (2.11 to 2.13) and its check; the P2P audit.
* :mod:`.models`: the GPT-style model zoo, its presets (paper Table 2, small CPU ones) and stage split
  (the presets and the split live in :mod:`.presets`, the supported torch range in :mod:`.versions`:
  neither imports torch, so ``ctrlmem run`` validates a run before launching without it).
* :mod:`.measure`: saved-tensor and allocator memory, theory peaks, measured costs → ``Costs``.
* :mod:`.recompute`: ``--recompute``: a non-reentrant checkpoint per stage (or attention core),
  its recomputed tensors metered and its recomputations counted.
* :mod:`.offload`: ``--offload``: saved tensors of an offloaded forward to host memory and back.
* :mod:`.launch`: ``ctrlmem run``: validate (torch range, NCCL ranks vs GPUs), launch torchrun
  locally (``dp · p`` ranks with ``--dp``), assemble ``result.json``; Slurm script emission.
* :mod:`.worker`: the per-rank entry point torchrun starts (a ``(dp, pp)`` device mesh when ``dp > 1``).
* :mod:`.replay`: one device's pass order in one process, for paper-scale measurement
  (``ctrlmem replay`` → ``replay.json``).
"""
