"""Checking a ``torch.save`` file of a generation (``optimizer.pt``, a DeepSpeed partition, a
Lightning ``.ckpt``) without torch: see ``readers.read_torch_zip``."""

from __future__ import annotations

from typing import Any

from recoverydash.checkpoints.formats.base import Generation
from recoverydash.checkpoints.formats.readers import TorchFile, UnreadableFile, read_torch_zip
from recoverydash.checkpoints.formats.store import Tree
from recoverydash.checkpoints.objects import StorageError

NUMPY_GLOBALS = frozenset({
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray",
    "numpy.dtype", "numpy.dtypes.UInt32DType"})
"""numpy arrays (RNG states): what transformers' ``Trainer`` allows ``torch.load`` to read
(``transformers.trainer_pt_utils.safe_globals``)."""

MEGATRON_GLOBALS = NUMPY_GLOBALS | {
    "types.SimpleNamespace", "pathlib.PosixPath", "argparse.Namespace", "_io.BytesIO",
    "signal.Signals", "megatron.core.transformer.enums.AttnBackend",
    "megatron.core.transformer.enums.CudaGraphScope", "megatron.core.enums.ModelType",
    "megatron.core.optimizer.optimizer_config.OptimizerConfig",
    "megatron.core.rerun_state_machine.RerunDiagnostic",
    "megatron.core.rerun_state_machine.RerunMode", "megatron.core.rerun_state_machine.RerunState"}
"""What Megatron's checkpoints name (its ``args``, RNG states, enums): megatron-core 0.16's
``megatron.core.safe_globals.SAFE_GLOBALS``, which it registers for ``torch.load``."""

DEEPSPEED_GLOBALS = NUMPY_GLOBALS | {
    "argparse.Namespace", "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address"}
"""What DeepSpeed's engine writes beside tensors (the ZeRO stage enum, its loss scaler, the
client's ``args``)."""


def check_torch_file(tree: Tree, gen: Generation, rel: str,
                     allowed: frozenset[str] = frozenset()) -> TorchFile | None:
    """Read the torch zip at ``rel`` (``readers.read_torch_zip``, within the pickle budget): a
    broken one is recorded on ``gen`` (``size_mismatch`` when truncated, ``schema_unsupported``
    when not a torch file or over the budget, ``storage_unverified`` when storage could not
    answer) and None returned. Globals its pickle names outside ``readers.SAFE_GLOBALS`` and
    ``allowed`` (the framework's own classes) are ``refused_globals``, naming each (nothing of
    them ran; the generation is never restorable). Legacy non-zip files are noted, not
    checked."""
    entry = tree.files.get(rel)
    if entry is None:
        return None
    try:
        with tree.open(rel) as f:
            found = read_torch_zip(f, entry.size, allowed)
    except UnreadableFile as e:
        gen.problem(e.code, f"{rel}: {e.detail}")
        return None
    except StorageError as e:
        gen.problem("storage_unverified", f"{rel}: {e}")
        return None
    if found.legacy:
        gen.notes.append(f"{rel}: legacy (non-zip) torch file, only its presence is checked")
    if found.refused:
        gen.problem("refused_globals", refused_detail(rel, found.refused))
        gen.refused_globals.update(found.refused)
    return found


def refused_detail(rel: str, refused: set[str]) -> str:
    """The detail of a ``refused_globals`` reason: the file and every global it names (sorted;
    the first 20 and how many more)."""
    names = sorted(refused)
    more = f" and {len(names) - 20} more" if len(names) > 20 else ""
    return (f"{rel} names {len(names)} global(s) a checkpoint loader must not import: "
            f"{', '.join(names[:20])}{more} (read as inert placeholders: nothing ran; "
            "torch.load(weights_only=True) refuses them too)")


def top_keys(found: TorchFile | None) -> dict[str, Any]:
    """The top-level dict of a torch file (empty when it is not a dict)."""
    return found.obj if found is not None and isinstance(found.obj, dict) else {}
