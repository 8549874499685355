"""Integrations of the observed data ledger with the loaders and trainers people run.

Each module imports its framework only when used (no hard dependency):

* ``recoverydash.integrations.pytorch``: plain PyTorch loops (``torch.utils.data.DataLoader``),
  ``observed_loader`` builds the loader whose samples carry their positions.
* ``recoverydash.integrations.torchdata``: torchdata's ``StatefulDataLoader`` (also with worker
  processes): the loader's state is part of the recorder's state, so a checkpoint's data progress
  restores it in one call.
* ``recoverydash.integrations.hf``: HF Transformers ``Trainer`` (``watch_trainer`` or
  ``RecoverydashCallback``, and ``resume_checkpoint``): ledger, ``checkpoint-N/`` generations,
  attempts.
* ``recoverydash.integrations.lightning``: PyTorch Lightning (``RecoverydashCallback``,
  ``resume_checkpoint``): ledger, ``.ckpt`` generations, attempts.
* ``recoverydash.integrations.torchtitan``: torchtitan's ``CheckpointManager`` and
  ``ParallelAwareDataloader`` (``watch_torchtitan``, ``resume_step``): ``step-N/`` generations,
  sync and async, and the packed token stream per data-parallel shard.
* ``recoverydash.integrations.streaming``: Mosaic Streaming (``observe_streaming``,
  ``streaming_cursor``): Streaming's global sample order, one stratum per stream.
* ``recoverydash.integrations.megatron``: Megatron-Core ``GPTDataset`` / ``BlendedDataset``
  (``ObservedMegatronDataset``): sample positions or token ranges per blended source.

All build on ``recoverydash.sdk.observe`` (its module doc is the contract).
"""
