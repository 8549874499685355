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

Both build on ``recoverydash.sdk.observe`` (its module doc is the contract).
"""
