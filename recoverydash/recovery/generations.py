"""Generation statuses and reason codes (docs/definitions.md#restorable,
#generation-status; seeds 002, 004).

A generation is ``restorable`` when it is committed by exactly one manifest of a supported schema,
every required shard and component is present, all parts are at the manifest's update, the world
size and dataset version agree with the attempt that wrote it, its data progress cursor equals the
ledger's frontier at its update, no model object repeats an older generation's digest (nor an
optimizer object, unless the optimizer never changed: ``optimizer_stateless``, a finding), and the
storage verifier found every object ``ok``.

Statuses: ``pending`` (no manifest yet), ``abandoned`` (never committed and superseded by a later
generation or its attempt is over; reason ``never_committed``), ``rejected`` (a reason below),
``committed`` (manifest in, but some object not checked yet, an object the verifier could not
check (``storage_unverified``), or the ledger has not reached the generation's update, so the data
cursor cannot be compared yet), ``restorable``.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from .counting import epoch_tail
from .inputs import AttemptRecord, GenerationRecord, is_adopted
from .lineage import cursor_keys
from .result import GenerationEntry, ReasonEntry

#: Storage results that reject a generation (spec 5; ``object_outside_locations`` is ours: an
#: object under none of the project's storage locations, which the server never reads).
STORAGE_FAILURES = ("object_missing", "size_mismatch", "digest_mismatch",
                    "object_outside_locations")
#: Components whose digest identifies trained state (spec 5, ``stale_state``).
STATE_COMPONENTS = ("model", "optimizer")


@dataclass
class Reason:
    """A reason code of spec 5 with a human-readable detail."""

    code: str
    detail: str

    def to_dict(self) -> ReasonEntry:
        return {"code": self.code, "detail": self.detail}


@dataclass
class GenerationVerdict:
    """One entry of spec 5 ``generations``, plus what the restore plan needs."""

    generation_id: str
    attempt: int
    update: int | None
    status: str
    reasons: list = field(default_factory=list)
    started_at: float | None = None
    committed_at: float | None = None
    notes: list = field(default_factory=list)
    #: the generation's record (None for a verdict built by hand): :attr:`manifest` reads it
    record: GenerationRecord | None = field(default=None, repr=False, compare=False)

    @property
    def manifest(self) -> dict | None:
        """The manifest the generation was judged by (:meth:`.inputs.GenerationRecord.manifest`,
        with its objects), None without one or without a record."""
        return self.record.manifest() if self.record is not None else None

    @property
    def has_manifest(self) -> bool:
        """Whether a manifest is in (read from the record's head: no object list is touched)."""
        return self.record is not None and self.record.manifest_head() is not None

    def to_dict(self) -> GenerationEntry:
        """Spec 5's generation entry; ``notes`` (what could not be judged, which changes no
        status: :func:`adopted_notes`) only when there are any."""
        out: GenerationEntry = {"generation_id": self.generation_id, "attempt": self.attempt,
               "update": self.update, "status": self.status,
               "reasons": [r.to_dict() for r in self.reasons]}
        if self.notes:
            out["notes"] = [n.to_dict() for n in self.notes]
        return out


def _short(items) -> str:
    items = list(items)
    shown = ", ".join(str(i) for i in items[:5])
    return shown + (f" and {len(items) - 5} more" if len(items) > 5 else "")


def shard_missing(gen: GenerationRecord, manifest: dict) -> Reason | None:
    """Required shards (manifest's and checkpoint_started's) with no object in the manifest."""
    required = list(dict.fromkeys(list(manifest.get("required_shards") or [])
                                  + list(gen.required_shards)))
    present = {o.get("shard") for o in manifest.get("objects") or []}
    missing = [s for s in required if s not in present]
    return Reason("shard_missing", f"no object for required shard {_short(missing)}") \
        if missing else None


def components_without_object(manifest: dict, components) -> list:
    """The names among ``components`` that no object of ``manifest`` carries (an object carries
    its ``component``, or each of its ``components`` when it names several), in the given order:
    the "no object for component X" part of :func:`component_missing`."""
    carried = {c for o in manifest.get("objects") or [] for c in _held(o)}
    return [c for c in dict.fromkeys(components) if c not in carried]


def _held(o: dict) -> list:
    many = o.get("components")
    return list(many) if isinstance(many, list) and many else [o.get("component")]


def component_missing(manifest: dict, required_components) -> Reason | None:
    """Components of the contract's ``required_components`` or of the manifest's ``components``
    with no object; and a component carried by more than half of the required shards (at least
    two) that some required shard lacks (one optimizer shard missing). An object that
    holds several components (a Lightning ``.ckpt``) names them all in ``components`` (an
    extension of docs/ingest-v1.md#objects-and-shards) and carries each of them."""
    objects = manifest.get("objects") or []
    held = _held
    carried = {c for o in objects for c in held(o)}
    needed = list(required_components) + list(manifest.get("components") or [])
    problems = [f"no object for component {c}"
                for c in components_without_object(manifest, needed)]
    shards = list(manifest.get("required_shards") or [])
    held_by: dict = {}  # one pass over the objects (not one per required shard)
    for o in objects:
        try:
            held_by.setdefault(o.get("shard"), set()).update(held(o))
        except TypeError:  # an unhashable shard value equals no required shard (a dict key)
            continue
    by_shard = {s: held_by.get(s, set()) for s in shards}
    for component in sorted(c for c in carried if c is not None):
        holders = [s for s in shards if component in by_shard[s]]
        lacking = [s for s in shards if by_shard[s] and component not in by_shard[s]]
        if len(holders) >= 2 and len(holders) * 2 > len(shards) and lacking:
            problems.append(f"shard {_short(lacking)} lacks component {component}")
    return Reason("component_missing", "; ".join(problems)) if problems else None


def update_mismatch(gen: GenerationRecord, manifest: dict) -> Reason | None:
    """Objects, shards or checkpoint_started at another update than the manifest."""
    update = manifest.get("update")
    parts = [f"object {o.get('uri')} at update {o['update']}"
             for o in manifest.get("objects") or [] if o.get("update", update) != update]
    parts += [f"shard {name} at update {shard.update}" for name, shard in sorted(gen.shards.items())
              if shard.update is not None and shard.update != update]
    if gen.update is not None and gen.update != update:
        parts.append(f"checkpoint_started at update {gen.update}")
    return Reason("update_mismatch", f"manifest at update {update}, but {_short(parts)}") \
        if parts else None


def world_size_mismatch(manifest: dict, writer: AttemptRecord | None) -> Reason | None:
    """Manifest ``world_size`` differs from the writing attempt's world size."""
    if writer is None or writer.world_size is None or manifest.get("world_size") is None:
        return None
    if manifest["world_size"] == writer.world_size:
        return None
    return Reason("world_size_mismatch",
                  f"manifest world_size {manifest['world_size']}, attempt {writer.attempt} "
                  f"runs {writer.world_size}")


def dataset_version_mismatch(manifest: dict, writer: AttemptRecord | None) -> Reason | None:
    """Manifest ``dataset_version`` differs from the writing attempt's dataset version."""
    if writer is None or writer.dataset_version is None:
        return None
    if manifest.get("dataset_version") == writer.dataset_version:
        return None
    return Reason("dataset_version_mismatch",
                  f"manifest dataset_version {manifest.get('dataset_version')!r}, attempt "
                  f"{writer.attempt} reads {writer.dataset_version!r}")


def schema_unsupported(manifest: dict) -> Reason | None:
    """``schema_revision`` other than 1 (spec 4)."""
    if manifest.get("schema_revision") == 1:
        return None
    return Reason("schema_unsupported", f"schema_revision {manifest.get('schema_revision')!r}")


def cursors_agree(declared: list, expected: list, complete: set) -> list[str]:
    """Differences between a manifest's ``data_progress.cursor`` and the ledger's frontier
    (docs/definitions.md#expected-cursor).

    Per stratum: equal ``(epoch, position)``; or the manifest at ``(e + 1, 0)`` where the ledger's
    epoch ``e`` is complete under the tail rule (``complete``: the strata whose expected epoch has
    no tail left to count, :func:`.counting.epoch_tail` with the epoch length and the lineage's
    real global batch: a drop_last remainder is complete); or a manifest cursor at position 0 for
    a stratum the ledger never consumed. Returns the disagreements (empty: they agree)."""
    mine = {c["stratum"]: (int(c.get("epoch", 0)), int(c.get("position", 0))) for c in declared}
    ledger = {c["stratum"]: (c["epoch"], c["position"]) for c in expected}
    out = []
    for stratum in sorted(set(mine) | set(ledger)):
        got, want = mine.get(stratum), ledger.get(stratum)
        if got == want or (want is None and got is not None and got[1] == 0):
            continue
        if got is not None and want is not None and got == (want[0] + 1, 0) \
                and stratum in complete:
            continue
        out.append(f"{stratum}: manifest {got}, ledger {want}")
    return out


def expected_cursor_at(view, lineage, declared: Sequence = ()) -> tuple[list, set]:
    """The ledger's frontier of ``lineage`` as cursors (:func:`.lineage.cursor_of`), and the
    strata whose epoch there is complete under the tail rule (an epoch length is known and the
    unconsumed tail is 0 or shorter than the global batch of the attempt that consumed it,
    :meth:`.view.RunView.global_batch`). Completeness is worked out only for the strata whose
    ``declared`` cursor names the start of the next epoch, the one case where it matters."""
    frontiers = view.frontier(lineage)
    keys = cursor_keys(frontiers, view.id_strata)
    next_epoch = {c.get("stratum"): int(c.get("epoch", 0)) for c in declared
                  if int(c.get("position", 0)) == 0}
    expected, complete = [], set()
    for stratum in sorted(keys):
        key = keys[stratum]
        expected.append({"stratum": stratum, "epoch": key[1], "position": frontiers[key]})
        length = view.epoch_length(stratum)
        if next_epoch.get(stratum) == key[1] + 1 and length is not None \
                and epoch_tail(frontiers[key], length, view.global_batch(lineage, key)) == 0:
            complete.add(stratum)
    return expected, complete


def adopted_reasons(manifest: dict) -> list[Reason]:
    """The reasons a format adapter found in another tool's folder (``adopted.reasons`` of the
    manifest it built: ``shard_missing``, ``component_missing``, ``size_mismatch``,
    ``update_mismatch`` ... under that format's completeness rule, docs/formats.md). They replace
    :func:`shard_missing` and :func:`component_missing` for an adopted generation: those rules
    read shards and components the way our own manifests record them, which an adapter's
    reconstruction does not (a DCP file holds model and optimizer items of one rank; the
    contract's ``data_progress`` component exists in no other tool's layout). Malformed entries
    are ignored."""
    adopted = manifest.get("adopted") or {}
    return [Reason(r["code"], str(r.get("detail", ""))) for r in adopted.get("reasons") or []
            if isinstance(r, dict) and isinstance(r.get("code"), str)]


def adopted_notes(manifest: dict | None) -> list[Reason]:
    """What cannot be judged of an adopted generation, said instead of assumed
    (docs/definitions.md#data-position-unknown): ``data_position_unknown`` when its manifest
    carries no data cursor (no other tool records one: the cursor comparison is skipped, so a
    restart from it can be neither confirmed exact nor shown to replay or omit samples), and
    ``dataset_version_unknown`` when it names no dataset version. Empty for our own manifests
    and for adopted ones that carry both."""
    if manifest is None or not is_adopted(manifest):
        return []
    out = []
    fmt = manifest["adopted"].get("format") or "another tool"
    if not (manifest.get("data_progress") or {}).get("cursor"):
        out.append(Reason("data_position_unknown",
                          f"data position unknown: the {fmt} checkpoint records no data cursor, "
                          "so whether a restart from it continues the data stream is not "
                          "known from the checkpoint"))
    if manifest.get("dataset_version") in (None, "", "unknown"):
        out.append(Reason("dataset_version_unknown",
                          f"dataset version unknown: the {fmt} checkpoint records none"))
    return out


def state_repeats(generations) -> dict:
    """docs/definitions.md#stale-state-and-stateless-optimizers: per generation id, ``(stale,
    stateless)``: the sentences of its ``stale_state`` reason (empty: none), and the finding
    ``optimizer_stateless`` (or None), from the sha256 of its ``model`` and ``optimizer``
    objects compared with those of the generations committed before it, in the order of commit
    (:func:`repeat_order`: by writer attempt, then update; single-manifest generations with an
    int update; others are not compared).

    * a model object repeating a digest of an earlier generation: the save wrote old
      model state (``stale_state``);
    * an optimizer object repeating one, while the generations below had not all written the
      same optimizer bytes (the optimizer's state had changed between them), or while another
      optimizer object of the same generation is new (that shard's optimizer moved on since
      the last save: physicsnemo #2012): ``stale_state``;
    * an optimizer object repeating one while every generation below wrote exactly the same
      optimizer digests and no optimizer object of the generation is new (unchanged since the
      first save: a stateless optimizer, plain SGD without momentum, writes the same bytes
      every time): no rejection; the finding ``optimizer_stateless`` on the first such
      generation only (reported once). See :func:`judge_repeats`.

    One pass in that order (generations of one attempt and update are compared with earlier
    ones only)."""
    rows = [row for row in map(repeat_row, generations) if row is not None]
    return continue_repeats(rows)[0]


#: The :func:`continue_repeats` basis of no generation compared yet.
EMPTY_REPEATS = {"top": None, "told": False, "optimizer": None, "changed": False}


def repeat_row(gen: GenerationRecord) -> tuple | None:
    """What :func:`state_repeats` compares of ``gen``: ``(update, generation_id, [(component,
    sha256, uri)], attempt)`` of its ``model`` and ``optimizer`` objects with a sha256, or None
    when it is not compared (no manifest, a manifest conflict, or an update that is not an
    int). ``attempt``: the writer the manifest names, else the reporting attempt; with the
    update it gives the order of commit (:func:`repeat_order`). Reads the manifest's objects
    (:meth:`.inputs.GenerationRecord.manifest`) only when compared."""
    head = gen.manifest_head()
    update = head.get("update") if head is not None else None
    if head is None or gen.conflicting() > 1 or type(update) is not int:
        return None
    named = head.get("attempt")
    return (update, gen.generation_id,
            [(o.get("component"), o["sha256"], o.get("uri"))
             for o in (gen.manifest() or {}).get("objects") or []
             if o.get("component") in STATE_COMPONENTS and o.get("sha256")],
            named if type(named) is int else gen.attempt)


def repeat_order(row: tuple) -> tuple:
    """docs/definitions.md#stale-state-and-stateless-optimizers: where a :func:`repeat_row`
    stands in the order of commit: ``(attempt, update)``. An attempt that numbers its updates
    below the update it restored (docs/definitions.md#renumbered-updates) saves after every
    generation of the attempts before it, whatever its update numbers."""
    return (row[3], row[0])


def judge_repeats(update: int, objects: list, first_seen: dict, changed: bool) -> tuple:
    """docs/definitions.md#stale-state-and-stateless-optimizers for one generation at
    ``update``: ``(stale, stateless)``, the sentences of its ``stale_state`` reason and the
    ``optimizer_stateless`` finding it would carry (None), from its ``objects`` (``[(component,
    sha256, uri)]``), ``first_seen`` (``{(component, sha256): (update, generation_id)}`` of the
    generations below) and ``changed`` (the optimizer's digests had changed between them).

    A model object repeating an older digest is stale, unless that digest was first written at
    this same ``update`` (a later attempt's save of the same state). An optimizer object
    repeating one is stale when ``changed``, or when another optimizer object of this
    generation is new (in no generation below: that shard's optimizer moved on, so this one
    wrote old state); else the optimizer looks stateless: the finding names the first
    repeating object (the caller reports it once per run)."""
    fresh = any(component == "optimizer" and (component, sha256) not in first_seen
                for component, sha256, _uri in objects)
    stale, stateless = [], None
    for component, sha256, uri in objects:
        older = first_seen.get((component, sha256))
        if older is None:
            continue
        u, og = older
        if u == update:
            # the state of the same update written again (a later attempt re-ran the rolled
            # back updates deterministically, or saved right after restoring it): not stale
            continue
        if component == "optimizer" and not changed and not fresh:
            if stateless is None:
                stateless = Reason("optimizer_stateless", (
                    f"optimizer object {uri} has the same bytes (sha256) as in "
                    f"generation {og} (update {u}), and the optimizer's objects have not "
                    f"changed since the first save: a stateless optimizer (plain SGD "
                    f"without momentum) writes the same bytes at every save; this is "
                    f"no stale state and rejects nothing"))
            continue
        if component == "model":
            what = "model state"
        elif changed:
            what = "optimizer state (it had changed between earlier generations)"
        else:
            what = ("optimizer state (another optimizer object of this generation changed "
                    "since the last save)")
        stale.append(f"{component} object {uri} repeats the sha256 of "
                     f"generation {og} (update {u}): this save wrote the {what} of "
                     f"update {u} again, not that of update {update}")
    return stale, stateless


def continue_repeats(rows, basis: dict | None = None, seen: dict | None = None) -> tuple:
    """The pass of :func:`state_repeats` over ``rows`` (:func:`repeat_row`, any order),
    continued from the generations judged before: ``basis`` (:data:`EMPTY_REPEATS` when None)
    says what those were (``top``: the last of them, ``[attempt, update]`` of
    :func:`repeat_order`; ``told``: whether one got the
    ``optimizer_stateless`` finding; ``optimizer``: the sorted sha256 of the first optimizer
    set seen, ``changed``: whether a different one was seen since), ``seen`` gives
    ``{(component, sha256): (update, generation_id)}``, the first (in :func:`repeat_order`,
    then id) generation of every digest of ``rows`` that occurs among them (digests absent
    from it occur in none).

    Returns ``(out, first, basis)``: ``out`` as :func:`state_repeats` for ``rows``' generations
    (equal to the pass over every generation, the earlier ones included), ``first`` the digests
    first seen in ``rows`` (``{(component, sha256): (update, generation_id)}``, none of
    ``seen``), and the basis after ``rows``. Raises ValueError when a row is not after
    ``basis["top"]`` in :func:`repeat_order`, or the basis predates that order (the earlier
    generations' results could change: judge all of them)."""
    basis = dict(EMPTY_REPEATS if basis is None else basis)
    rows = sorted(rows, key=lambda r: (repeat_order(r), r[1]))
    top = basis["top"]
    if rows and top is not None and (not isinstance(top, list)
                                     or repeat_order(rows[0]) <= tuple(top)):
        raise ValueError(f"generation {rows[0][1]} at update {rows[0][0]} is not above the "
                         f"judged ones ({top})")
    first_seen: dict = dict(seen or {})
    first: dict = {}
    optimizer = frozenset(basis["optimizer"]) if basis["optimizer"] is not None else None
    changed_any = bool(basis["changed"])
    told = bool(basis["told"])
    out: dict = {}
    i = 0
    while i < len(rows):
        j = i
        while j < len(rows) and repeat_order(rows[j]) == repeat_order(rows[i]):
            j += 1
        group = rows[i:j]
        for update, gid, objects, _attempt in group:
            stale, stateless = judge_repeats(update, objects, first_seen, changed_any)
            if stateless is not None and told:
                stateless = None  # reported once
            if stateless is not None:
                told = True
            out[gid] = (stale, stateless)
        for update, gid, objects, _attempt in group:
            for component, sha256, _uri in objects:
                key = (component, sha256)
                if key not in first_seen:
                    first_seen[key] = first[key] = (update, gid)
            found = frozenset(sha for component, sha, _uri in objects if component == "optimizer")
            if found:
                if optimizer is None:
                    optimizer = found
                elif found != optimizer:
                    changed_any = True
        basis["top"] = list(repeat_order(group[0]))
        i = j
    basis.update(told=told, changed=changed_any,
                 optimizer=sorted(optimizer) if optimizer is not None else None)
    return out, first, basis


def local_judgement(gen: GenerationRecord, required_components) -> dict:
    """The part of a committed, single-manifest generation's verdict that is a function of its
    own record (``gen``: its manifest, shard reports and storage results) and of the contract's
    ``required_components`` alone (docs/definitions.md#generation-status), as JSON values:

    * ``notes``: :func:`adopted_notes`, as ``[{"code", "detail"}]``;
    * ``before``: the reasons :func:`schema_unsupported`, :func:`shard_missing` and
      :func:`component_missing` (or :func:`adopted_reasons` for an adopted manifest) and
      :func:`update_mismatch` found, in that order;
    * ``storage``: the storage failures (:data:`STORAGE_FAILURES`, in that order, each naming
      its objects' uris), ``soft``: ``storage_unverified`` (or empty), ``unchecked``: whether
      an object of the manifest has no storage result yet.

    What depends on other records (the writer's world size and dataset version, the data
    cursor against the ledger, ``stale_state`` against other generations) is not in it:
    :func:`evaluate_generations` judges that on every call. Raises nothing for a generation
    without a manifest (``gen.manifest()`` None gives the empty judgement of no objects), but
    it is only used for committed ones."""
    manifest = gen.manifest() or {}
    notes = adopted_notes(manifest) if manifest else []
    structural: Sequence[Reason | None]
    if is_adopted(manifest):
        structural = adopted_reasons(manifest)
    else:
        structural = [shard_missing(gen, manifest),
                      component_missing(manifest, required_components)]
    before = [r for r in (schema_unsupported(manifest), *structural,
                          update_mismatch(gen, manifest)) if r is not None]
    unchecked = False
    by_code: dict = {}
    for obj in manifest.get("objects") or []:
        result = gen.object_checks.get(obj.get("uri"))
        if result is None:
            unchecked = True
        elif result != "ok":
            by_code.setdefault(result, []).append(obj.get("uri"))
    storage = [Reason(code, _short(by_code[code])) for code in STORAGE_FAILURES
               if code in by_code]
    soft = [Reason("storage_unverified", _short(by_code["storage_unverified"]))] \
        if "storage_unverified" in by_code else []
    return {"notes": [n.to_dict() for n in notes], "before": [r.to_dict() for r in before],
            "storage": [r.to_dict() for r in storage], "soft": [r.to_dict() for r in soft],
            "unchecked": unchecked}


def cursor_basis(view) -> str:
    """What the data cursor check of every generation reads beside its writer's capped lineage
    and the ledger's updates within it (docs/definitions.md#expected-cursor): the strata of
    sample ids, and per attempt its global batch and sampler epoch lengths. A short digest: a
    kept cursor check (:func:`evaluate_generations`' ``checks``) holds while it is the same."""
    doc = [sorted(view.id_strata), [
        [number, record.global_batch(), (record.sampler or {}).get("epoch_length")]
        for number, record in view.attempts.items()]]
    return hashlib.blake2b(json.dumps(doc, sort_keys=True, default=repr).encode(),
                           digest_size=12).hexdigest()


def _lineage_key(lineage) -> list:
    return [[[s.attempt, s.after, s.upto] for s in lineage.segments],
            [list(p) for p in lineage.pretracked], lineage.root, lineage.unknown_root]


def _when(g: GenerationRecord) -> float:
    """When ``g`` began: its start, else its commit time, else -inf (POSIX seconds)."""
    for value in (g.started_at, g.commit_time()):
        if value is not None:
            return value
    return float("-inf")


def _without_manifest(verdict: GenerationVerdict, gen: GenerationRecord, generations: list,
                      writer, newest_attempt: int | None) -> None:
    """Status of a generation with no committed manifest: ``abandoned`` (``never_committed``)
    when a later generation began or its attempt is over, else ``pending``."""
    superseded = any(_when(o) > _when(gen) for o in generations if o is not gen)
    over = writer is not None and writer.ended_at is not None \
        or (newest_attempt is not None and newest_attempt > verdict.attempt)
    if superseded or over:
        verdict.status = "abandoned"
        why = "superseded by a later generation" if superseded else "its attempt is over"
        verdict.reasons.append(Reason("never_committed", "no manifest; " + why))
    else:
        verdict.status = "pending"


def _judgement(gen: GenerationRecord, required_components, judged: dict | None,
               fill: dict | None) -> dict:
    """``gen``'s :func:`local_judgement`: the one in ``judged`` when there is one, else made
    now and put in ``fill`` (when given)."""
    mine = judged.get(gen.generation_id) if judged is not None else None
    if mine is None:
        mine = local_judgement(gen, required_components)
        if fill is not None:
            fill[gen.generation_id] = mine
    return mine


def _stale_reason(stale: list) -> Reason:
    """The ``stale_state`` reason naming at most three of the ``stale`` objects' sentences."""
    more = f"; and {len(stale) - 3} more objects" if len(stale) > 3 else ""
    return Reason("stale_state", "; ".join(stale[:3]) + more)


def _data_cursor(view, gen: GenerationRecord, manifest: dict, by: int, update: int,
                 key_of: tuple | None, checks: dict | None, checks_fill: dict | None,
                 absorbed: dict | None) -> list | None:
    """The data-cursor disagreements of ``gen`` (written by attempt ``by`` at ``update``), or
    None while the ledger does not reach ``update`` on the writer's lineage (undecided). A
    comparison made here is put in ``checks_fill`` under its key (``key_of``: the cursor basis
    and writer, None: no key) with the capped lineage."""
    lineage = view.lineage(by, update)
    if not view.reaches(lineage, update):
        return None
    key = None if key_of is None else [key_of[0], key_of[1], _lineage_key(lineage)]
    kept = checks.get(gen.generation_id) if checks is not None else None
    problems = _cursor_problems(view, manifest, lineage, update, key, kept, absorbed)
    if checks_fill is not None and problems is not (kept or {}).get("problems"):
        checks_fill[gen.generation_id] = {"key": key, "problems": problems}
    return problems


def _cursor_problems(view, manifest: dict, lineage, update: int, key, kept: dict | None,
                     absorbed: dict | None) -> list:
    """The data-cursor disagreements of a generation at ``update`` whose lineage the ledger
    reaches (:func:`cursors_agree` of its declared cursor and :func:`expected_cursor_at`): the
    ``kept`` comparison's when its ``key`` is this one and the ledger absorbed no update at or
    below ``update`` in the lineage since (``absorbed``: the lowest absorbed update per
    attempt; None: unknown, so compared again), else compared now."""
    if kept is not None and absorbed is not None and kept["key"] == key and all(
            absorbed.get(seg.attempt, update + 1) > update for seg in lineage.segments):
        return kept["problems"]
    progress = manifest.get("data_progress") or {}
    declared = [c for c in progress.get("cursor") or []
                if c.get("stratum") not in view.id_strata]
    expected, complete = expected_cursor_at(view, lineage, declared)
    return cursors_agree(declared, expected, complete)


def _cursor_step(view, gen: GenerationRecord, verdict, unknown: set, basis, checks,
                 checks_fill, absorbed) -> tuple:
    """The data-cursor step of :func:`evaluate_generations` for ``gen`` (its ``verdict`` being
    built; ``unknown``: the codes of its notes): ``(waiting, data_cursor_mismatch Reason or
    None)``. A generation whose writer never reached the server
    (docs/definitions.md#resume-from-a-generation-the-server-had-not-seen) is not compared:
    the note ``data_cursor_unchecked`` says so."""
    by = verdict.attempt
    if "data_position_unknown" in unknown:
        return False, None  # that note already says its data position cannot be compared
    resume = view.resumes.get(by)
    if resume is not None and resume.unseen:
        verdict.notes.append(Reason("data_cursor_unchecked", (
            f"nothing of attempt {by}, which wrote it, reached the server: its data cursor "
            f"could not be compared with what the model received")))
        return False, None
    manifest = gen.manifest_head() or {}
    update = manifest.get("update")
    if not isinstance(update, int) or "data_position_unknown" in unknown:
        return False, None
    key_of = None if basis is None else (basis, by)
    problems = _data_cursor(view, gen, manifest, by, update, key_of, checks, checks_fill,
                            absorbed)
    if problems is None:
        return True, None
    return False, Reason("data_cursor_mismatch", "; ".join(problems)) if problems else None


def evaluate_generations(view, required_components, judged: dict | None = None,
                         fill: dict | None = None, repeats: dict | None = None,
                         checks: dict | None = None, checks_fill: dict | None = None,
                         absorbed: dict | None = None) -> list[GenerationVerdict]:
    """Status and reasons of every generation of ``view`` (:class:`~.view.RunView`; spec 5,
    docs/definitions.md#generation-status), sorted by (update, started time, id).

    The data cursor is compared with the frontier of the writer's lineage capped at the
    manifest's update, once the ledger holds that update (else the generation stays
    ``committed``), under the epoch tail rule with the lineage's real global batch. An adopted
    generation (a manifest a format adapter built from another tool's folder) is judged by its
    adapter's reasons (:func:`adopted_reasons`) instead of the shard and component rules, and
    when it carries no data cursor the comparison is skipped and the verdict's ``notes`` say
    ``data_position_unknown`` (:func:`adopted_notes`): never assumed to agree.

    ``judged``: ``{generation_id: local_judgement(gen, required_components)}`` computed before
    for generations whose record and ``required_components`` are the same now (the caller
    keeps that true: an entry of a changed record must be dropped); used instead of judging
    those parts again, so the result is the same as without it. ``fill``, when given, receives
    the :func:`local_judgement` of every committed generation judged here afresh. ``repeats``:
    :func:`state_repeats` of ``view.generations`` worked out by the caller (incrementally,
    :func:`continue_repeats`), used instead of that pass. Of a generation's manifest only the
    head (:meth:`.inputs.GenerationRecord.manifest_head`) is read beyond what the judgements
    and repeats not given need.

    ``checks``: ``{generation_id: {"key", "problems"}}``, data cursor comparisons made before
    (``checks_fill`` receives every one made here, JSON values), for generations whose record
    is the same (the caller drops a changed record's, as for ``judged``); one is used when its
    key (:func:`cursor_basis`, the writer, its capped lineage) is the same and the ledger
    absorbed no update at or below the generation's update for an attempt of that lineage
    since: ``absorbed`` ``{attempt: the lowest update absorbed since}`` (None: unknown, no
    kept comparison is used). Whether the ledger reaches the update is decided every time."""
    checks = checks if absorbed is not None else None
    basis = cursor_basis(view) if checks is not None or checks_fill is not None else None
    generations = list(view.generations.values())
    attempts = view.attempts
    newest_attempt = view.live  # an attempt older than the live one is over
    if repeats is None:
        repeats = state_repeats(generations)

    out = []
    for gen in generations:
        by = view.writers.get(gen.generation_id, gen.attempt)
        writer = attempts.get(by)
        manifest = gen.manifest_head()
        verdict = GenerationVerdict(gen.generation_id, by, gen.state_update(), "",
                                    started_at=gen.started_at, committed_at=gen.commit_time(),
                                    record=gen)
        out.append(verdict)
        if manifest is None:
            _without_manifest(verdict, gen, generations, writer, newest_attempt)
            continue
        if gen.conflicting() > 1:
            verdict.status = "rejected"
            verdict.reasons.append(Reason("manifest_conflict",
                                          f"{gen.conflicting()} different committed manifests"))
            continue
        mine = _judgement(gen, required_components, judged, fill)
        verdict.notes = [Reason(**n) for n in mine["notes"]]
        unknown = {n.code for n in verdict.notes}
        hard = [Reason(**r) for r in mine["before"]]
        hard += [r for r in (world_size_mismatch(manifest, writer),
                             None if "dataset_version_unknown" in unknown
                             else dataset_version_mismatch(manifest, writer)) if r is not None]
        waiting, mismatch = _cursor_step(view, gen, verdict, unknown, basis, checks,
                                         checks_fill, absorbed)
        if mismatch is not None:
            hard.append(mismatch)
        stale, stateless = repeats.get(gen.generation_id, ([], None))
        if stale:
            hard.append(_stale_reason(stale))
        if stateless is not None:
            verdict.notes.append(stateless)
        hard += [Reason(**r) for r in mine["storage"]]
        soft = [Reason(**r) for r in mine["soft"]]
        verdict.reasons = hard + soft
        verdict.status = ("rejected" if hard else
                          "committed" if soft or mine["unchecked"] or waiting else "restorable")
    out.sort(key=lambda v: (v.update if v.update is not None else -1,
                            v.started_at if v.started_at is not None else float("-inf"),
                            v.generation_id))
    return out
