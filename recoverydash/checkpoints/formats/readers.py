"""Readers of checkpoint file structures that never import torch and never run code from a file.

* :func:`read_pickle`: a restricted unpickler, run only once :func:`~.pickle_scan.scan_pickle`
  found the pickle within :data:`~.pickle_scan.PICKLE_BUDGET` (opcodes, stack, memo, bytes and
  the objects it would build, worked out before anything is built). ``find_class`` imports
  nothing: torch's tensor rebuild functions and storage types (the whitelist) are replaced by
  stubs that describe a tensor (its storage key, dtype, element count) without materialising
  it; a few plain containers map to ``dict`` / ``set`` / ``tuple``; every other global is
  replaced by an inert :class:`Refused` placeholder that records its name and arguments, so a
  user's class inside a checkpoint neither runs nor makes the file unreadable. Of those, the
  ones outside :data:`SAFE_GLOBALS` (what ``torch.load``'s default, ``weights_only=True``,
  accepts, and DCP's metadata classes) and outside the caller's ``allowed`` (a framework's own
  classes) are *refused*: named in ``refused``, and a generation whose file has any is never
  ``restorable`` (reason ``refused_globals``).
* :func:`read_torch_zip`: a ``torch.save`` file (zip) read with ``zipfile``: its central
  directory, ``data.pkl`` through the restricted unpickler, and every storage the pickle refers to
  checked present with at least the bytes its element count needs.
* :func:`read_dcp_metadata`: a ``torch.distributed.checkpoint`` ``.metadata`` file (a pickled
  ``Metadata``): its storage items (file, offset, length) and tensor FQNs.
* :func:`read_safetensors_header`: the 8-byte little-endian header length and the JSON header of
  a ``.safetensors`` file, with each tensor's declared byte range.

Each raises :class:`UnreadableFile` (with a spec reason code) when the structure is broken.
"""

from __future__ import annotations

import _compat_pickle
import io
import json
import pickle
import struct
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple

from recoverydash.checkpoints.formats.pickle_scan import (
    PICKLE_BUDGET,
    OverBudget,
    PickleBudget,
    scan_pickle,
)

MAX_PICKLE_BYTES = PICKLE_BUDGET.bytes
"""A ``data.pkl`` or ``.metadata`` larger than this (bytes) is not read (a structural check only
needs small files; tensors live outside the pickle): ``PICKLE_BUDGET.bytes``."""


class UnreadableFile(Exception):
    """A file whose structure is broken. ``code``: ``size_mismatch`` (shorter or longer than its
    own structure declares) or ``schema_unsupported`` (not the format at all)."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


# --- the restricted unpickler ------------------------------------------------------------------

class Refused:
    """An inert stand-in for a global the reader refused to import (``name``: ``module.qualname``).
    It records what the pickle passed to it (arguments, state, items) and nothing else."""

    name = "?"

    def field(self, name: str, default: Any = None) -> Any:
        """A field of the pickled object's state (dataclasses, plain objects), or ``default``."""
        state = self.__dict__.get("state")
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            merged = {**(state[0] or {}), **(state[1] or {})}
            return merged.get(name, default)
        if isinstance(state, dict):
            return state.get(name, default)
        return self.__dict__.get(name, default)

    def __repr__(self) -> str:
        return f"<refused {self.name}>"


class _General(Refused):
    """Any refused class: takes whatever the pickle gives (NEWOBJ arguments, a state of any
    shape, list and dict items)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _General:
        obj = object.__new__(cls)
        obj.__dict__["args"] = args
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.__dict__["state"] = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.__dict__.setdefault("items", {})[key] = value

    def append(self, value: Any) -> None:
        self.__dict__.setdefault("list", []).append(value)

    def extend(self, values: Any) -> None:
        self.__dict__.setdefault("list", []).extend(values)


class _Plain(Refused):
    """The stand-in for torch's own plain classes (DCP's metadata dataclasses, ``torch.Size``,
    paths): no ``__new__`` or ``__setstate__`` in Python, so the C unpickler builds them and
    fills their ``__dict__`` itself (a ``.metadata`` holds tens of thousands of them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # REDUCE only (torch.Size((2, 3)))
        self.__dict__["args"] = args


class _TupleState(list[Any], Refused):
    """The stand-in for torch classes whose pickled state is a tuple (they define
    ``__getstate__``: DCP's ``TensorProperties``): BUILD appends the state to the list, a C call
    (``list.append``), so the thousands of them in a ``.metadata`` cost no Python frame."""

    __setstate__ = list.append

    def __hash__(self) -> int:  # type: ignore[override]  # an identity, like its object
        return id(self)

    def field(self, name: str, default: Any = None) -> Any:
        return default


_REFUSED_TYPES: dict[str, type] = {}
#: torch classes whose pickled state is not a dict (they define ``__getstate__``).
_TUPLE_STATE = {"torch.distributed.checkpoint.metadata.TensorProperties"}


def _refused_type(name: str) -> type:
    t = _REFUSED_TYPES.get(name)
    if t is None:
        base = _TupleState if name in _TUPLE_STATE else _Plain if name.startswith(
            ("torch.distributed.checkpoint.", "pathlib.")) or name == "torch.Size" else _General
        t = type("Refused", (base,), {"name": name})
        _REFUSED_TYPES[name] = t
    return t


#: Bytes per element of torch's storage types (the ``storage_type`` of a persistent id).
STORAGE_ITEM_BYTES = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2,
    "LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1,
    "BoolStorage": 1, "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8,
    "UntypedStorage": 1, "QInt8Storage": 1, "QUInt8Storage": 1, "QInt32Storage": 4,
    "QUInt4x2Storage": 1, "QUInt2x4Storage": 1, "Float8_e4m3fnStorage": 1,
    "Float8_e5m2Storage": 1, "Float8_e4m3fnuzStorage": 1, "Float8_e5m2fnuzStorage": 1,
}


@dataclass(frozen=True)
class StorageType:
    """Stub of ``torch.<X>Storage`` (never imported): its name and bytes per element."""

    name: str

    @property
    def item_bytes(self) -> int | None:
        return STORAGE_ITEM_BYTES.get(self.name)


@dataclass(frozen=True)
class DType:
    """Stub of a ``torch.<dtype>`` value (``torch.float32`` pickles as a global)."""

    name: str


@dataclass
class StorageRef:
    """A persistent id of a torch zip: storage ``key`` (``data/<key>`` in the zip), its type and
    element count, and the device it was saved from."""

    key: str
    storage_type: StorageType | None
    numel: int
    location: str

    @property
    def nbytes(self) -> int | None:
        size = self.storage_type.item_bytes if self.storage_type else None
        return None if size is None else size * self.numel


@dataclass
class TensorRef:
    """A tensor described, not materialised: its storage, offset (elements) and shape."""

    storage: StorageRef | None
    offset: int = 0
    shape: tuple[Any, ...] = ()


MAX_DIMS = 64
"""The most dimensions a tensor stub takes (torch's own limit); a longer shape is refused rather
than copied (a pickle could hand every tensor the same million-item list)."""


def _rebuild_tensor(storage: Any, storage_offset: Any = 0, size: Any = (), *rest: Any,
                    **kw: Any) -> TensorRef:
    args = size.__dict__.get("args") if isinstance(size, Refused) else None
    dims = args[0] if args else size or ()
    if not isinstance(dims, (tuple, list)) or len(dims) > MAX_DIMS:
        raise ValueError(f"a tensor shape that is not a tuple of at most {MAX_DIMS} sizes")
    shape = tuple(dims)
    return TensorRef(storage if isinstance(storage, StorageRef) else None, int(storage_offset or 0),
                     shape)


def _rebuild_parameter(data: Any, *rest: Any, **kw: Any) -> Any:
    return data


def _rebuild_from_type(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    if func in (_rebuild_tensor, _rebuild_parameter) and isinstance(args, tuple) \
            and len(args) <= 8:
        return func(*args)
    return _refused_type("torch._tensor._rebuild_from_type_v2")()


def _layout(name: Any) -> str:
    """``torch.serialization._get_layout``: a layout's name (a string, nothing else: ``str`` of
    a nested list would spell out every item)."""
    if type(name) is not str:
        raise ValueError("a layout that is not named by a string")
    return name


MAX_HASHED = 1 << 20
"""Items :func:`_unique` hashes at most for one set or dict built by a call (a tuple's hash
reads every item, so a set of a thousand references to one big tuple would read it a thousand
times)."""


def _hash_cost(obj: Any, seen: dict[int, int]) -> int:
    if type(obj) is not tuple:
        return 1
    got = seen.get(id(obj))
    if got is None:
        got = seen[id(obj)] = 1 + sum(_hash_cost(x, seen) for x in obj)
    return got


def _unique(items: Iterable[Any], pairs: bool = False) -> list[Any]:
    """``items`` as a list, refused (ValueError) when hashing them (their first items when
    ``pairs``: a dict's keys) would read more than :data:`MAX_HASHED` items."""
    got = list(items)
    seen: dict[int, int] = {}
    cost = 0
    for x in got:
        cost += _hash_cost(x[0] if pairs and isinstance(x, (tuple, list)) and x else x, seen)
        if cost > MAX_HASHED:
            raise ValueError(f"a set or dict whose keys would take over {MAX_HASHED} items to "
                             "hash")
    return got


def _set(items: Any = ()) -> set[Any]:
    return set(_unique(items))


def _frozenset(items: Any = ()) -> frozenset[Any]:
    return frozenset(_unique(items))


def _dict(items: Any = (), **kw: Any) -> dict[Any, Any]:
    return dict(_unique(items.items() if isinstance(items, dict) else items, True), **kw)


class _OrderedDict(dict[Any, Any]):
    """``collections.OrderedDict`` read as a dict that also takes attributes (a module's
    ``state_dict`` carries ``_metadata``)."""

    def __init__(self, items: Any = (), **kw: Any) -> None:
        super().__init__(_unique(items.items() if isinstance(items, dict) else items, True),
                         **kw)


_TORCH_WHITELIST: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type,
    ("collections", "OrderedDict"): _OrderedDict,
    ("builtins", "set"): _set,
    ("builtins", "frozenset"): _frozenset,
    ("builtins", "tuple"): tuple,
    ("builtins", "list"): list,
    ("builtins", "dict"): _dict,
    ("__builtin__", "set"): _set,
    # Reduced by a C builtin, so a .metadata's many sizes and tensor properties run no Python
    # frame (tuple and int copy or read nothing the pre-scan has not charged):
    # torch.Size((64, 64)) is the tuple (64, 64), a layout its name, a DCP memory
    # format encoding its number.
    ("torch", "Size"): tuple,
    ("torch.serialization", "_get_layout"): _layout,
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"): int,
}

_DTYPE_NAMES = {
    "float32", "float", "float64", "double", "float16", "half", "bfloat16", "int64", "long",
    "int32", "int", "int16", "short", "int8", "uint8", "bool", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "uint16", "uint32",
    "uint64", "qint8", "quint8", "qint32",
}


SAFE_GLOBALS = frozenset({
    # what torch.load's default (weights_only=True) accepts besides tensors, storages, dtypes
    "torch.Size", "torch.device", "torch.Tensor", "torch.nn.parameter.Parameter",
    "torch.serialization._get_layout", "collections.OrderedDict", "collections.Counter",
    "_codecs.encode", "builtins.bytearray", "builtins.set", "builtins.complex",
    "torch._tensor._rebuild_from_type_v2", "torch.per_tensor_affine",
    "torch.per_tensor_symmetric", "torch.per_channel_affine", "torch.per_channel_symmetric",
    "torch.per_channel_affine_float_qparams",
    *(f"torch._utils.{f}" for f in (
        "_rebuild_parameter", "_rebuild_parameter_with_state", "_rebuild_qtensor",
        "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_sparse_tensor",
        "_rebuild_meta_tensor_no_storage", "_rebuild_nested_tensor", "_rebuild_wrapper_subclass",
        "_rebuild_device_tensor_from_numpy", "_rebuild_device_tensor_from_cpu_tensor")),
    # plain containers this reader maps to builtins
    "builtins.frozenset", "builtins.tuple", "builtins.list", "builtins.dict", "__builtin__.set",
    # what torch.distributed.checkpoint writes in a .metadata (its reader allows them)
    "torch.distributed.checkpoint.filesystem._StorageInfo", "pathlib.PosixPath",
    "pathlib.WindowsPath", "pathlib._local.PosixPath", "pathlib._local.WindowsPath",
})
"""Globals a checkpoint's pickle may name without being refused (read as stubs or inert
placeholders all the same): what ``torch.load`` accepts by default (``weights_only=True``:
torch 2.13's ``torch._weights_only_unpickler._get_allowed_globals``), torch's storage types and
dtypes, and the classes of ``torch.distributed.checkpoint.metadata`` (any name of that module)
with the storage info and paths DCP writes beside them."""

#: modules any of whose names is safe (DCP's metadata dataclasses and enums)
_SAFE_MODULES = ("torch.distributed.checkpoint.metadata",)


def is_safe_global(module: str, name: str, allowed: frozenset[str] = frozenset()) -> bool:
    """Whether the global ``module.name`` is in :data:`SAFE_GLOBALS`, in ``allowed`` (a
    framework's own classes, as ``module.qualname``), is a torch storage type or dtype, or
    belongs to a module of :data:`_SAFE_MODULES`."""
    qual = f"{module}.{name}"
    if qual in SAFE_GLOBALS or qual in allowed or module in _SAFE_MODULES:
        return True
    return module == "torch" and (name.endswith("Storage") or name in _DTYPE_NAMES)


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, allowed: frozenset[str] = frozenset()):
        super().__init__(io.BytesIO(data))
        self.refused: set[str] = set()
        self.storages: list[StorageRef] = []
        self.allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (protocol 2 pickles, torch.save's) as Python 3 reads them
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        stub = _TORCH_WHITELIST.get((module, name))
        if stub is not None:
            return stub
        if module == "torch" and name.endswith("Storage"):
            return StorageType(name)
        if module == "torch" and name in _DTYPE_NAMES:
            return DType(name)
        qual = f"{module}.{name}"
        if not is_safe_global(module, name, self.allowed):
            self.refused.add(qual)
        return _refused_type(qual)

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            _, stype, key, location, numel = pid[:5]
            ref = StorageRef(str(key), stype if isinstance(stype, StorageType) else None,
                             int(numel), str(location))
            self.storages.append(ref)
            return ref
        return _refused_type("persistent_id")(pid)


@dataclass
class Unpickled:
    """What :func:`read_pickle` found: the object (stubs inside) and the refused global names."""

    obj: object
    refused: set[str] = field(default_factory=set)
    storages: list[StorageRef] = field(default_factory=list)


def read_pickle(data: bytes, allowed: frozenset[str] = frozenset(),
                budget: PickleBudget = PICKLE_BUDGET) -> Unpickled:
    """Unpickle ``data`` with the restricted unpickler (module doc) once
    :func:`~.pickle_scan.scan_pickle` found it within ``budget``. ``allowed``: globals not to
    count as refused beyond :data:`SAFE_GLOBALS` (``module.qualname``). Raises UnreadableFile
    (``size_mismatch`` when the stream ends early, ``schema_unsupported`` otherwise: malformed,
    or over the budget, the detail saying which limit)."""
    try:
        scan_pickle(data, budget)
    except OverBudget as e:
        raise UnreadableFile(e.code, f"pickle of {len(data)} bytes: {e.detail}") from None
    u = _RestrictedUnpickler(data, allowed)
    try:
        obj = u.load()
    except EOFError as e:
        raise UnreadableFile("size_mismatch",
                             f"pickle stream ends early ({len(data)} bytes)") from e
    except pickle.UnpicklingError as e:
        code = "size_mismatch" if "truncated" in str(e) else "schema_unsupported"
        raise UnreadableFile(code, f"not a readable pickle ({len(data)} bytes): {e}") from e
    except Exception as e:  # malformed opcodes, a stub used in a way no stub supports
        raise UnreadableFile("schema_unsupported", f"not a readable pickle: {e!r}"[:300]) from e
    return Unpickled(obj, u.refused, u.storages)


# --- torch.save zip files ----------------------------------------------------------------------

@dataclass
class TorchFile:
    """A ``torch.save`` zip read without torch: ``obj`` (the top-level object with
    :class:`TensorRef` stubs), ``storages`` (persistent ids met), ``refused`` globals."""

    obj: object
    storages: list[StorageRef]
    refused: set[str]
    legacy: bool = False


ZIP_MAGIC = b"PK\x03\x04"


def read_torch_zip(fileobj: IO[bytes] | io.BufferedIOBase | io.RawIOBase, size: int,
                   allowed: frozenset[str] = frozenset(),
                   budget: PickleBudget = PICKLE_BUDGET) -> TorchFile:
    """Read a ``torch.save`` file (zip format) from a seekable binary reader of ``size`` bytes.

    Checks: a central directory (a truncated zip has none), one ``*/data.pkl`` of at most
    ``budget.bytes`` bytes as the zip declares it (a larger one is not read: a zip of 63 KiB may
    declare 64 MiB), that :func:`read_pickle` reads within ``budget``, and every storage it
    refers to present as ``*/data/<key>`` with at least ``numel * item bytes`` bytes. Globals
    outside :data:`SAFE_GLOBALS` and ``allowed`` come back in ``refused``. Legacy (pre-1.6,
    non-zip) files come back with ``legacy=True`` and nothing checked. Raises UnreadableFile."""
    fileobj.seek(0)
    head = fileobj.read(4)
    if head != ZIP_MAGIC:
        if head[:1] == b"\x80":  # a pickle protocol opcode: torch's legacy format
            return TorchFile(None, [], set(), legacy=True)
        raise UnreadableFile("schema_unsupported", "not a torch.save file (no zip signature)")
    try:
        zf = zipfile.ZipFile(fileobj)
    except zipfile.BadZipFile as e:
        raise UnreadableFile("size_mismatch", f"zip without a central directory ({size} bytes): "
                                              f"truncated while written or copied ({e})") from e
    with zf:
        infos = {i.filename: i for i in zf.infolist()}
        data, prefix = _data_pkl(zf, infos, size, budget)
        got = read_pickle(data, allowed, budget)
        _check_storages(infos, prefix, got.storages)
        return TorchFile(got.obj, got.storages, got.refused)


def _data_pkl(zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo], size: int,
              budget: PickleBudget) -> tuple[bytes, str]:
    """The bytes of a torch zip's one ``data.pkl`` and the records' prefix, once every record
    ends within the file and the pickle declares at most ``budget.bytes``."""
    pkl = [n for n in infos if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pkl) != 1:
        raise UnreadableFile("schema_unsupported", f"{len(pkl)} data.pkl records in the zip")
    for info in infos.values():
        end = info.header_offset + info.compress_size + len(info.filename) + 30
        if end > size:
            raise UnreadableFile("size_mismatch", f"record {info.filename} ends past the "
                                                  f"file's {size} bytes")
    declared = infos[pkl[0]].file_size
    if declared > budget.bytes:
        raise UnreadableFile("schema_unsupported", f"data.pkl declares {declared} bytes, over "
                                                   f"the {budget.bytes} a pickle may have: not "
                                                   "read")
    try:
        return zf.read(pkl[0]), pkl[0][:-len("data.pkl")]
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise UnreadableFile("size_mismatch", f"data.pkl unreadable: {e}") from e


def _check_storages(infos: dict[str, zipfile.ZipInfo], prefix: str,
                    storages: list[StorageRef]) -> None:
    seen: set[str] = set()
    for ref in storages:
        if ref.key in seen:
            continue
        seen.add(ref.key)
        found = infos.get(f"{prefix}data/{ref.key}")
        if found is None:
            raise UnreadableFile("size_mismatch", f"storage data/{ref.key} is not in the zip")
        if ref.nbytes is not None and found.file_size < ref.nbytes:
            raise UnreadableFile("size_mismatch", f"storage data/{ref.key} holds "
                                                  f"{found.file_size} bytes, needs "
                                                  f"{ref.nbytes}")


# --- torch.distributed.checkpoint .metadata ----------------------------------------------------

class StorageItem(NamedTuple):
    """One storage item of a DCP save: the tensor or bytes ``fqn``, the file it lives in
    (relative to the checkpoint folder), its byte ``offset`` and ``length`` there."""

    fqn: str
    relative_path: str
    offset: int
    length: int


@dataclass
class DcpMetadata:
    """A ``.metadata`` file read without torch: every storage item, and the FQNs the save holds."""

    items: list[StorageItem]
    fqns: list[str]
    refused: set[str]


def read_dcp_metadata(data: bytes) -> DcpMetadata:
    """Decode a DCP ``.metadata`` (pickled ``torch.distributed.checkpoint.metadata.Metadata``)
    with the restricted unpickler. Returns its storage items (``storage_data``: MetadataIndex ->
    _StorageInfo(relative_path, offset, length)) and the keys of ``state_dict_metadata``. Raises
    UnreadableFile when it is not such a pickle."""
    got = read_pickle(data)
    md = got.obj
    if not isinstance(md, Refused) or not md.name.endswith("checkpoint.metadata.Metadata"):
        raise UnreadableFile("schema_unsupported", "the .metadata pickle is not a DCP Metadata "
                                                   f"({getattr(md, 'name', type(md).__name__)})")
    sdm = md.field("state_dict_metadata")
    storage_data = md.field("storage_data")
    if not isinstance(sdm, dict) or not isinstance(storage_data, dict):
        raise UnreadableFile("schema_unsupported", "Metadata without state_dict_metadata or "
                                                   "storage_data")
    items = []
    for index, info in storage_data.items():
        fields = getattr(info, "__dict__", None) or {}
        fqn = (getattr(index, "__dict__", None) or {}).get("fqn", index)
        rel, offset, length = (fields.get("relative_path"), fields.get("offset"),
                               fields.get("length"))
        if type(rel) is not str or type(offset) is not int or type(length) is not int:
            raise UnreadableFile("schema_unsupported", f"storage info of {fqn} lacks "
                                                       "relative_path/offset/length")
        items.append(StorageItem(fqn if type(fqn) is str else str(fqn), rel, offset, length))
    return DcpMetadata(items, [str(k) for k in sdm], got.refused)


#: Metadata's fields (``Metadata.__dataclass_fields__`` in torch 2.4 to 2.13)
DCP_METADATA_FIELDS = frozenset({"state_dict_metadata", "planner_data", "storage_data",
                                 "storage_meta", "version"})
_STORAGE_META_KEY = b"\x8c\x0cstorage_meta"  # SHORT_BINUNICODE 'storage_meta'
_LITERALS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "BININT",
                       "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG", "SHORT_BINBYTES",
                       "BINBYTES", "BINBYTES8", "BINSTRING", "SHORT_BINSTRING", "BINFLOAT",
                       "FRAME"})


class DcpLayout(NamedTuple):
    """A ``.metadata`` split where its ``storage_meta`` value begins (torch >= 2.4 writes the
    save's ``checkpoint_id`` and a fresh ``save_id`` there, so saves of one job differ only
    there). ``key``: the bytes before it (everything that declares the state dict and the
    storage items), with the covering protocol-4 frame's length left out; ``tail``: the
    opcodes after it, as ``(name, argument)`` with literal arguments (strings, numbers, frame
    lengths) as None, and ``STACK_GLOBAL``'s the two strings before it (the global it names,
    compared like any opcode); ``strings``: the string literals of the tail."""

    key: bytes
    tail: tuple[tuple[str, Any], ...]
    strings: tuple[str, ...]


def dcp_layout(data: bytes) -> DcpLayout | None:
    """The :class:`DcpLayout` of a ``.metadata``'s bytes, or None when it cannot be split so
    (no ``storage_meta`` key after ``storage_data``, frames that do not chain to the end, a
    tail that is not well-formed pickle opcodes ending with STOP at the last byte). Reads
    opcodes only (``pickletools.genops``): nothing is built, nothing imported."""
    import pickletools

    at = data.rfind(_STORAGE_META_KEY)
    if at < 0 or data.rfind(b"\x8c\x0cstorage_data", 0, at) < 0 or len(data) - at > MAX_TAIL:
        return None
    v = at + len(_STORAGE_META_KEY)
    if data[v:v + 1] == b"\x94":  # MEMOIZE
        v += 1
    covering, p, n = None, 2, len(data)
    if data[:1] == b"\x80" and data[2:3] == b"\x95":  # protocol 4+: frames from byte 2
        while p < n and data[p] == 0x95:
            if p < v:
                covering = p
            p += 9 + int.from_bytes(data[p + 1:p + 9], "little")
        if p != n:
            return None  # unframed parts (large strings) or a broken chain: not split
    key = data[:v] if covering is None else data[:covering + 1] + data[covering + 9:v]
    got = _plain_tail(data, v)
    if got is not None:
        return DcpLayout(key, *got) if got else None
    tail: list[tuple[str, Any]] = []
    strings: list[str] = []
    try:
        for op, arg, pos in pickletools.genops(data[v:]):
            literal = op.name in _LITERALS
            tail.append((op.name, tuple(strings[-2:]) if op.name == "STACK_GLOBAL"
                         else None if literal else arg))
            if literal and isinstance(arg, str):
                strings.append(arg)
            if op.name == "STOP":
                if v + (pos or 0) + 1 != n:
                    return None
                break
        else:
            return None
    except ValueError:
        return None
    return DcpLayout(key, tuple(tail), tuple(strings))


MAX_TAIL = 64 * 1024
"""Bytes from ``storage_meta`` to a ``.metadata``'s end that :func:`dcp_layout` reads at most
(``FileSystemWriter`` writes a few hundred): a longer tail is not split, so the file is decoded
on its own, within the pickle budget."""

#: opcodes without argument (byte -> pickletools name) that :func:`_plain_tail` reads itself
_BARE_OPS = {0x94: "MEMOIZE", 0x93: "STACK_GLOBAL", 0x29: "EMPTY_TUPLE", 0x81: "NEWOBJ",
             0x7d: "EMPTY_DICT", 0x28: "MARK", 0x4e: "NONE", 0x5d: "EMPTY_LIST",
             0x75: "SETITEMS", 0x73: "SETITEM", 0x62: "BUILD", 0x65: "APPENDS", 0x61: "APPEND",
             0x74: "TUPLE", 0x85: "TUPLE1", 0x86: "TUPLE2", 0x87: "TUPLE3", 0x88: "NEWTRUE",
             0x89: "NEWFALSE", 0x52: "REDUCE", 0x30: "POP"}


def _plain_tail(data: bytes, v: int
                ) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]] | tuple[()] | None:
    """What ``pickletools.genops`` gives :func:`dcp_layout` for the opcodes from ``v``, read
    directly when they are only the argument-less opcodes of :data:`_BARE_OPS`, BINGET and
    SHORT_BINUNICODE (what ``FileSystemWriter`` writes after ``storage_meta``): ``(tail,
    strings)``; ``()`` when STOP is not at the last byte; None for anything else (an unknown
    opcode, a string running past the end or not UTF-8): then genops reads it."""
    tail: list[tuple[str, Any]] = []
    strings: list[str] = []
    add, bare, n, p = tail.append, _BARE_OPS, len(data), v
    while p < n:
        b = data[p]
        if b == 0x2e:  # STOP
            tail.append(("STOP", None))
            return (tuple(tail), tuple(strings)) if p + 1 == n else ()
        name = bare.get(b)
        if name == "STACK_GLOBAL":  # the names it imports are no literal: compared
            add((name, tuple(strings[-2:])))
            p += 1
        elif name is not None:
            add((name, None))
            p += 1
        elif b == 0x8c and p + 1 < n:  # SHORT_BINUNICODE: one length byte, UTF-8
            end = p + 2 + data[p + 1]
            if end > n:
                return None
            try:
                strings.append(str(data[p + 2:end], "utf-8", "surrogatepass"))
            except UnicodeDecodeError:
                return None
            add(("SHORT_BINUNICODE", None))
            p = end
        elif b == 0x68 and p + 1 < n:  # BINGET: one byte memo index
            add(("BINGET", data[p + 1]))
            p += 2
        else:
            return None
    return None


def same_save_layout(a: DcpLayout, b: DcpLayout) -> bool:
    """Whether ``b``'s ``.metadata`` decodes to ``a``'s state dict and storage items: the same
    bytes before ``storage_meta``'s value and the same tail opcodes, only literals differing,
    none of ``b``'s differing strings naming a Metadata field (so the tail sets no other)."""
    if a.key != b.key or a.tail != b.tail:
        return False
    return all(x == y or y not in DCP_METADATA_FIELDS
               for x, y in zip(a.strings, b.strings, strict=False))


# --- safetensors -------------------------------------------------------------------------------

SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
                           "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
                           "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8}
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit


@dataclass
class SafetensorsHeader:
    """A safetensors file's header: ``tensors`` name -> (dtype, shape, begin, end) with byte
    offsets relative to the data section, which starts at ``data_start``; ``metadata`` the
    ``__metadata__`` strings."""

    tensors: dict[str, tuple[str, tuple[int, ...], int, int]]
    metadata: dict[str, Any]
    data_start: int

    @property
    def declared_size(self) -> int:
        """Bytes the file must have: header plus the furthest tensor end."""
        return self.data_start + max((t[3] for t in self.tensors.values()), default=0)


def read_safetensors_header(head: bytes, size: int) -> SafetensorsHeader:
    """Parse a safetensors header from the file's first bytes ``head`` (at least 8 + header
    length; :func:`safetensors_header_length` tells how many) and check it against the file's
    ``size``: every tensor's ``data_offsets`` within the data section, its length equal to
    ``prod(shape) * dtype bytes``, and the file exactly as long as the furthest end (the
    safetensors library refuses trailing bytes). Raises UnreadableFile."""
    n = safetensors_header_length(head, size)
    if len(head) < 8 + n:
        raise UnreadableFile("size_mismatch", f"header of {n} bytes, file has {size}")
    try:
        doc = json.loads(head[8:8 + n])
    except (UnicodeDecodeError, ValueError) as e:
        raise UnreadableFile("schema_unsupported", f"safetensors header is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise UnreadableFile("schema_unsupported", "safetensors header is not a JSON object")
    meta = doc.pop("__metadata__", None) or {}
    tensors = {}
    for name, t in doc.items():
        try:
            dtype, shape, (begin, end) = t["dtype"], list(t["shape"]), t["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise UnreadableFile("schema_unsupported", f"tensor {name}: malformed entry") from e
        numel = 1
        for d in shape:
            numel *= int(d)
        item = SAFETENSORS_DTYPE_BYTES.get(dtype)
        if not (0 <= begin <= end) or (item is not None and end - begin != numel * item):
            raise UnreadableFile("schema_unsupported", f"tensor {name}: data_offsets "
                                                       f"[{begin}, {end}] for {dtype}{shape}")
        tensors[name] = (dtype, tuple(shape), int(begin), int(end))
    header = SafetensorsHeader(tensors, meta if isinstance(meta, dict) else {}, 8 + n)
    if header.declared_size > size:
        raise UnreadableFile("size_mismatch", f"tensors end at byte {header.declared_size}, the "
                                              f"file has {size}: truncated")
    if header.declared_size < size:
        raise UnreadableFile("size_mismatch", f"{size - header.declared_size} bytes after the "
                                              f"last tensor (ends at {header.declared_size})")
    return header


def safetensors_header_length(head: bytes, size: int) -> int:
    """The JSON header length declared by a safetensors file's first 8 bytes. Raises
    UnreadableFile when the file is shorter than 8 bytes or the length is implausible."""
    if len(head) < 8 or size < 8:
        raise UnreadableFile("size_mismatch", f"{size} bytes: no safetensors header")
    n: int = struct.unpack("<Q", head[:8])[0]
    if n > MAX_SAFETENSORS_HEADER:
        raise UnreadableFile("schema_unsupported", f"header length {n} is not plausible")
    if 8 + n > size:
        raise UnreadableFile("size_mismatch", f"header of {n} bytes, file has {size}: truncated")
    return n
