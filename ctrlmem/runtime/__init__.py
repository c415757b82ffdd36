"""Real execution of ctrlmem schedules on ``torch.distributed.pipelining`` (imports torch).

Import explicitly (``import ctrlmem.runtime``); ``import ctrlmem`` never imports torch.

* :mod:`.adapter`: the only module using torch's private pipelining API; Schedule → torch actions.
* :mod:`.models`: the GPT-style model zoo, its presets (paper Table 2, small CPU ones) and stage split.
* :mod:`.measure`: saved-tensor and allocator memory, theory peaks, measured costs → ``Costs``.
* :mod:`.launch`: ``ctrlmem run``: validate, launch torchrun locally, assemble ``result.json``;
  Slurm script emission.
* :mod:`.worker`: the per-rank entry point torchrun starts.
* :mod:`.replay`: one device's pass order in one process, for paper-scale measurement.
"""
