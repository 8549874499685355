"""The data model: projects and their tokens, runs, attempts, the raw event log, and the typed
tables that ingest projects events into (ledger rows, heartbeats, generations, checkpoint objects,
audit windows), plus the stored analysis of each run.

Vocabulary follows docs/definitions.md#words and the wire contract (docs/ingest-v1.md,
sections 2 to 4).
The raw event log is the record of what trainers said; every typed table can be rebuilt from it.
"""

from __future__ import annotations

import hashlib
import json
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

from recoverydash.recovery.inputs import same_manifest
from recoverydash.recovery.result import AnalysisResult, ClockFields
from recoverydash.runs.folding import unfold

SCOPE_INGEST = "ingest"
SCOPE_READ = "read"
# Prometheus scrapes (GET /metrics): the project's run metrics and service health, nothing else.
SCOPE_METRICS = "metrics"
# Configuration as code (the admin API, manage.py apply_config): webhook endpoints, storage
# locations, run contracts, and acknowledging, silencing and resolving alerts.
SCOPE_ADMIN = "admin"
SCOPES = (SCOPE_INGEST, SCOPE_READ, SCOPE_METRICS, SCOPE_ADMIN)
#: What a token gets when nobody asked for more (the dashboard's form, ``create_token``).
DEFAULT_SCOPES = (SCOPE_INGEST, SCOPE_READ)
TOKEN_PREFIX = "rdt_"


class Project(models.Model):
    """A team's space: runs, tokens, members, storage locations and alert endpoints belong to
    one."""

    name = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user who may see and act on a project's runs in the dashboard."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="memberships")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="uniq_member")]


def hash_token(raw: str) -> str:
    """sha256 hex of a raw token. Tokens carry 256 random bits, so a plain digest is enough."""
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


class ApiToken(models.Model):
    """A bearer token of one project with scopes among ``ingest``, ``read``, ``metrics`` and
    ``admin`` (docs/ingest-v1.md#authentication). Scopes do not include each other: an ``admin``
    token cannot push events or read analyses unless it also has those scopes.

    The raw token is shown once at creation; only its sha256 is stored. ``prefix`` (the first
    characters) lets people tell tokens apart in lists.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=16)
    token_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    @classmethod
    def issue(cls, project: Project, scopes: list[str], name: str = "") -> tuple[ApiToken, str]:
        """Create a token; returns ``(row, raw_token)``. Raises ValueError on an unknown scope."""
        unknown = sorted(set(scopes) - set(SCOPES))
        if unknown or not scopes:
            raise ValueError(f"scopes must be a non-empty subset of {list(SCOPES)}, got {scopes}")
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        row = cls.objects.create(project=project, name=name, prefix=raw[:12],
                                 token_hash=hash_token(raw), scopes=sorted(set(scopes)))
        return row, raw

    @classmethod
    def authenticate(cls, raw: str) -> ApiToken | None:
        """The live (not revoked) token for a raw bearer value, or None."""
        if not raw or len(raw) > 200:
            return None
        return (cls.objects.select_related("project")
                .filter(token_hash=hash_token(raw), revoked_at__isnull=True).first())

    def has_scope(self, scope: str) -> bool:
        return scope in (self.scopes or [])

    def touch(self, now=None, every_s: float = 60.0) -> None:
        """Record use: ``last_used_at`` is written at most once per ``every_s`` seconds, so a
        busy token does not turn every request into a row write."""
        now = now or timezone.now()
        if self.last_used_at is None or (now - self.last_used_at).total_seconds() >= every_s:
            type(self).objects.filter(pk=self.pk).update(last_used_at=now)
            self.last_used_at = now

    def revoke(self) -> None:
        """Revoke the token: it authenticates no more (401)."""
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])


class Run(models.Model):
    """A logical training run (``run_id``, docs/ingest-v1.md#2-common-fields), created on first
    sight, within one project.

    ``ingest_seq`` is the highest seq of the batches that touched the run (recoverydash.runs.seq:
    one database sequence on PostgreSQL, the run's count of batches on SQLite); rows carry the
    seq of the batch that wrote them. The analysis records the seq it has absorbed (at most
    ``runs.seq.committed_seq``): ``pending_analysis`` is ``ingest_seq > analysis.ingest_seq``.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runs")
    run_id = models.CharField(max_length=128)
    created_at = models.DateTimeField(default=timezone.now)
    first_event_at = models.DateTimeField(null=True, blank=True)   # trainer clock
    last_event_at = models.DateTimeField(null=True, blank=True)    # trainer clock
    last_received_at = models.DateTimeField(null=True, blank=True)  # server clock
    event_count = models.BigIntegerField(default=0)
    ingest_seq = models.BigIntegerField(default=0)
    # When an analysis task was last enqueued and not yet started (debounce, see
    # recoverydash.runs.analysis.request_analysis); None when none is waiting.
    analysis_queued_at = models.DateTimeField(null=True, blank=True)
    contract = models.JSONField(default=dict, blank=True)  # the latest attempt_started contract
    # ``contract``'s max_checkpoint_age_s as a number (``checkpoint_age_limit_of``), kept on every
    # save of the contract: the fleet orders by the at-risk ratio in SQL with it. None: the
    # contract declares no numeric limit (the default contract's applies).
    max_checkpoint_age_s = models.FloatField(null=True, blank=True)
    # stratum -> "ranges" | "ids": the kind of span the stratum uses; one kind throughout a
    # run (docs/ingest-v1.md#3-positions-spans-and-cursors), and ingest refuses a batch that
    # mixes them (400).
    strata = models.JSONField(default=dict, blank=True)
    # A launch of a failure drill (docs/ingest-v1.md#drill_result), set from attempt_started's
    # ``drill`` mark or a drill_result: ``drill_id`` names the drill ("" for an ordinary run),
    # ``is_drill`` is what the fleet's attention order leaves out (dashboard.queries.drill_field);
    # every other page treats a drill run as an ordinary run.
    drill_id = models.CharField(max_length=200, blank=True, default="", db_default="")
    is_drill = models.BooleanField(default=False, db_default=False, db_index=True)
    # Monitoring paused by a person (a run stopped on purpose): while paused (``is_paused``) its
    # alert rules are not evaluated, so nothing pages; the first event received after
    # ``paused_at`` ends the pause (``alerts.rules.evaluate_runs`` records that). Every pause and
    # resume is a ``MonitoringChange`` row.
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.CharField(max_length=150, blank=True, default="", db_default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "run_id"], name="uniq_run")]
        indexes = [models.Index(fields=["project", "-last_received_at"], name="run_recent")]

    def __str__(self) -> str:
        return self.run_id

    def save(self, *args, **kwargs):
        """Save, with ``max_checkpoint_age_s`` derived from ``contract``
        (``checkpoint_age_limit_of``) whenever the contract is saved."""
        self.max_checkpoint_age_s = checkpoint_age_limit_of(self.contract)
        fields = kwargs.get("update_fields")
        if fields is not None and "contract" in fields:
            kwargs["update_fields"] = list(fields) + ["max_checkpoint_age_s"]
        super().save(*args, **kwargs)

    @property
    def is_paused(self) -> bool:
        """Monitoring is paused: a person paused it and no event was received since."""
        return paused_now(self.paused_at, self.last_received_at)

    def analysis_summary(self, now=None) -> tuple[str | None, float | None]:
        """``(health, seconds_since_last_restorable)`` for lists (docs/ingest-v1.md#runs-list),
        read from the stored :class:`Analysis`: both None while no analysis exists. The seconds
        are the core's ``recovery.figures.seconds_since_last_restorable``
        (docs/definitions.md#seconds-since-last-restorable) of the stored result at ``now``
        (default: the clock), the same figure the run page, the alerts and the recovery answer
        show."""
        from recoverydash.recovery.figures import seconds_since_last_restorable

        try:
            analysis = self.analysis
        except Analysis.DoesNotExist:
            return None, None
        return analysis.health, seconds_since_last_restorable(
            analysis.result or {}, now or timezone.now(), self.first_event_at)


def paused_now(paused_at, last_received_at) -> bool:
    """Whether a run's monitoring is paused: paused at ``paused_at`` (None: not paused) and no
    event received (server clock ``last_received_at``) after it."""
    return paused_at is not None and (last_received_at is None or last_received_at <= paused_at)


class MonitoringChange(models.Model):
    """A pause or resume of a run's monitoring (the audit of ``Run.paused_at``): who (a user
    name, ``token <name>`` through the admin API, or "" when the run's next event resumed it),
    when, and the words they gave."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="monitoring_changes")
    paused = models.BooleanField()  # True: paused; False: resumed
    by = models.CharField(max_length=150, blank=True, default="")
    note = models.TextField(blank=True, default="")
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["-at"], name="monitoring_change_at")]


class Event(models.Model):
    """One accepted event as received: append-only, unique per ``(run, event_id)``.

    ``content_hash`` is the sha256 of the canonical JSON (sorted keys, no spaces) of the event; an
    event re-sent with the same id and hash is a duplicate, with another hash a conflict (409).
    """

    # No index of its own on ``run``: ``uniq_event`` and ``event_run_type`` begin with it (an
    # index kept up on every insert of the ingest path that no query needs).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events",
                            db_index=False)
    event_id = models.CharField(max_length=200)
    type = models.CharField(max_length=32)
    attempt = models.IntegerField()
    rank = models.IntegerField(null=True, blank=True)
    time = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)
    batch_seq = models.BigIntegerField(default=0)
    content_hash = models.CharField(max_length=64)
    body = models.JSONField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "event_id"], name="uniq_event")]
        indexes = [models.Index(fields=["run", "type", "attempt"], name="event_run_type")]


class DrillResult(models.Model):
    """One crash point of a failure drill as the drill runner reported it (``drill_result``,
    docs/ingest-v1.md#drill_result; the figures: docs/definitions.md#drill). ``run`` is the
    drill run (an ordinary run, ``run.drill_id`` set); the latest report of a (run, drill,
    crash point) wins."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="drill_results")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="drill_results")
    drill_id = models.CharField(max_length=200)
    config_digest = models.CharField(max_length=200)
    point = models.CharField(max_length=32)
    attempt = models.IntegerField()
    passed = models.BooleanField()
    expected_generation = models.CharField(max_length=200, blank=True, default="")
    restored_generation = models.CharField(max_length=200, blank=True, default="")
    verdict = models.CharField(max_length=32, blank=True, default="")  # "": server not asked
    replayed = models.BigIntegerField(null=True, blank=True)
    omitted = models.BigIntegerField(null=True, blank=True)
    recomputed = models.BigIntegerField(null=True, blank=True)
    first_divergence = models.JSONField(null=True, blank=True)
    state = models.JSONField(default=dict)
    cost = models.JSONField(default=dict)
    failures = models.JSONField(default=list)
    control_run_id = models.CharField(max_length=128, blank=True, default="")
    reported_at = models.DateTimeField()  # trainer clock (the event's time)
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "drill_id", "point"],
                                               name="uniq_drill_result")]
        indexes = [models.Index(fields=["project", "config_digest", "-reported_at"],
                                name="drill_latest")]


class Attempt(models.Model):
    """One launch of a run (docs/ingest-v1.md#attempt_started, #attempt_ended).

    A row may exist before its ``attempt_started`` arrives (events can come out of order);
    ``started_at`` is then null. ``resumed_from`` is the wire object or null (fresh start).
    ``fetched`` holds the furthest read cursor per stratum reported by heartbeats or the end.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    attempt = models.IntegerField()
    started_at = models.DateTimeField(null=True, blank=True)
    world_size = models.IntegerField(null=True, blank=True)
    dataset_version = models.CharField(max_length=500, blank=True, default="")
    global_batch_size = models.IntegerField(null=True, blank=True)
    micro_batch_size = models.IntegerField(null=True, blank=True)
    grad_accum_steps = models.IntegerField(null=True, blank=True)
    config_digest = models.CharField(max_length=500, blank=True, default="")
    sampler = models.JSONField(default=dict, blank=True)
    resumed_from = models.JSONField(null=True, blank=True)
    contract = models.JSONField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=16, blank=True, default="")
    end_update = models.BigIntegerField(null=True, blank=True)
    end_message = models.TextField(blank=True, default="")
    fetched = models.JSONField(default=list, blank=True)
    last_update = models.BigIntegerField(default=0)          # highest committed update seen
    last_update_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_event_at = models.DateTimeField(null=True, blank=True)
    restore_generation_id = models.CharField(max_length=200, blank=True, default="")
    restore_seconds = models.FloatField(null=True, blank=True)
    restored_at = models.DateTimeField(null=True, blank=True)
    # What the trainer's SDK could not deliver, as its heartbeats report it (sdk_dropped,
    # sdk_quarantined, sdk_lost_updates; docs/ingest-v1.md#heartbeat), per reporting rank:
    # {"<rank or c>": {"dropped": int, "quarantined": int, "updates": [first, last] | None}}.
    sdk_losses = models.JSONField(default=dict, blank=True)
    # Restores that did not complete (docs/ingest-v1.md#restore_failed), in the order reported:
    # [{"generation_id", "reason", "message", "time": RFC 3339, "rank": int | None}].
    restore_failures = models.JSONField(default=list, blank=True)
    # When the server last received an event of each reporter of this attempt: one RankSeen
    # row per reporter (ingest writes only the batch's reporters; see RankSeen).
    # The ingest seq of the batch that last wrote the row (recoverydash.runs.seq): the analysis
    # reads only the attempts whose seq lies above the one its stored inputs reflect.
    seq = models.BigIntegerField(db_default=0, default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "attempt"], name="uniq_attempt")]
        indexes = [models.Index(fields=["run", "seq"], name="attempt_run_seq")]

    def note_rank_seen(self, rank: int | None, received_at) -> None:
        """Record (in the database, the attempt saved) that an event of ``rank`` (None: a
        reporter without a rank) arrived at ``received_at`` (an aware datetime; only a later
        time replaces the kept one): :meth:`RankSeen.note` for one reporter."""
        RankSeen.note({self.pk: [reporter_key(rank)]}, received_at)

    def ranks_seen(self) -> dict:
        """``{reporter: aware datetime}`` of this attempt's RankSeen rows (``"<rank>"``, or
        ``"c"`` for events without a rank), ranks in numeric order, ``"c"`` last: what the
        core's ``reporter_ages`` reads. Empty when no reporter reported."""
        return seen_map(RankSeen.objects.filter(attempt_id=self.pk)
                        .values_list("reporter", "seen_at"))

    def note_restore_failure(self, generation_id: str, reason: str, message: str, time,
                             rank: int | None) -> None:
        """Record one ``restore_failed`` (the same generation, reason and rank once: a
        resend of the event changes nothing)."""
        entry = {"generation_id": generation_id, "reason": reason, "message": message,
                 "time": time.isoformat(), "rank": rank}
        same = [f for f in self.restore_failures or []
                if (f["generation_id"], f["reason"], f.get("rank"))
                == (generation_id, reason, rank)]
        if not same:
            self.restore_failures = [*(self.restore_failures or []), entry]

    @property
    def restore_failed(self) -> bool:
        """True when a restore failed and no later ``restore_completed`` of this attempt came:
        the attempt did not restore anything it meant to."""
        failures = self.restore_failures or []
        if not failures:
            return False
        if self.restored_at is None:
            return True
        from datetime import datetime

        return max(datetime.fromisoformat(f["time"]) for f in failures) > self.restored_at

    def note_sdk_losses(self, rank: int | None, dropped: int | None, quarantined: int | None,
                        updates: list | None) -> bool:
        """Keep a reporter's counts (they only grow within a process: the highest is kept) and
        widen its update range. Returns True when something changed."""
        key = "c" if rank is None else str(rank)
        before = dict(self.sdk_losses or {})
        entry = dict(before.get(key) or {"dropped": 0, "quarantined": 0, "updates": None})
        entry["dropped"] = max(entry["dropped"], dropped or 0)
        entry["quarantined"] = max(entry["quarantined"], quarantined or 0)
        if updates:
            old = entry["updates"]
            entry["updates"] = [min(old[0], updates[0]), max(old[1], updates[1])] if old \
                else [updates[0], updates[1]]
        if entry == before.get(key):
            return False
        self.sdk_losses = {**before, key: entry}
        return True

    @property
    def sdk_loss_summary(self) -> dict | None:
        """``{"dropped", "quarantined", "updates": [first, last] | None, "ranks": [...]}`` summed
        over the reporters of this attempt, or None when nothing was lost."""
        losses = self.sdk_losses or {}
        if not losses:
            return None
        spans = [e["updates"] for e in losses.values() if e.get("updates")]
        return {"dropped": sum(e.get("dropped", 0) for e in losses.values()),
                "quarantined": sum(e.get("quarantined", 0) for e in losses.values()),
                "updates": [min(u[0] for u in spans), max(u[1] for u in spans)] if spans
                else None,
                "ranks": sorted(losses, key=lambda k: (k == "c", int(k) if k.isdigit() else 0))}

    def advance_fetched(self, cursors: list[dict]) -> bool:
        """Keep the furthest read cursor per ``(stratum, epoch)`` (wire cursor dicts).
        Returns True when ``fetched`` changed."""
        merged = {(c["stratum"], c["epoch"]): c for c in self.fetched or []}
        changed = False
        for c in cursors:
            key = (c["stratum"], c["epoch"])
            old = merged.get(key)
            if old is None or c["position"] > old["position"]:
                merged[key] = {"stratum": c["stratum"], "epoch": c["epoch"],
                               "position": c["position"]}
                changed = True
        if changed:
            self.fetched = sorted(merged.values(), key=lambda c: (c["stratum"], c["epoch"]))
        return changed


GLOBAL_RANK = -1  # a ledger report with a null rank: the coordinator's global view



def reporter_key(rank: int | None) -> str:
    """A reporter's key (RankSeen.reporter, the core's ``reporter_ages``): ``str(rank)``, or
    ``"c"`` for events without a rank."""
    return "c" if rank is None else str(rank)


def seen_map(rows) -> dict:
    """``{reporter: seen_at}`` of ``(reporter, seen_at)`` pairs, ranks in numeric order and
    ``"c"`` (no rank) last."""
    return dict(sorted(rows, key=lambda r: (not r[0].isdigit(),
                                            int(r[0]) if r[0].isdigit() else 0)))


class RankSeen(models.Model):
    """When the server last received an event of one reporter of an attempt (the server's clock,
    not the trainer's): ``reporter`` is ``"<rank>"``, or ``"c"`` for events without a rank
    (docs/definitions.md#last-event-age; the silence rules read it, ``alerts.rules.silence_of``).

    One row per (attempt, reporter), so a request costs a row per reporter it carries, not one
    per rank of the world (:meth:`note`); an ``update_aggregate`` notes each of its ranks."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="ranks_seen_rows",
                                db_index=False)  # the unique key leads with it
    reporter = models.CharField(max_length=16)
    seen_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["attempt", "reporter"],
                                               name="uniq_rank_seen")]

    @classmethod
    def note(cls, reporters: dict, at) -> int:
        """Record that each reporter of ``reporters`` (``{attempt pk: iterable of reporter keys}``,
        :func:`reporter_key`) was heard from at ``at`` (an aware datetime): one
        ``INSERT ... ON CONFLICT (attempt, reporter) DO UPDATE`` for all of them, keeping the
        later of the stored and the new time (a batch whose clock is earlier, committed later,
        moves nothing back). Rows written: one per (attempt, reporter) given, whatever the
        attempt's world size. Returns that count (0: no statement)."""
        from django.db import connection

        pairs = [[pk, key] for pk, keys in reporters.items() for key in dict.fromkeys(keys)]
        if not pairs:
            return 0
        field = cls._meta.get_field("seen_at")
        stamp = field.get_db_prep_value(at, connection)
        table = connection.ops.quote_name(cls._meta.db_table)
        if connection.vendor == "postgresql":
            source = ("SELECT p.attempt_id, p.reporter, %s::timestamptz FROM unnest(%s::bigint[], "
                      "%s::text[]) AS p(attempt_id, reporter)")
            params = [stamp, [p[0] for p in pairs], [p[1] for p in pairs]]
            later = "GREATEST(excluded.seen_at, {t}.seen_at)"
        else:  # SQLite: one JSON parameter (no limit on bound variables); WHERE true parses
            source = ("SELECT json_extract(p.value, '$[0]'), json_extract(p.value, '$[1]'), %s "
                      "FROM json_each(%s) AS p WHERE true")
            params = [stamp, json.dumps(pairs)]
            later = "MAX(excluded.seen_at, {t}.seen_at)"
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} (attempt_id, reporter, seen_at) {source} "
                           f"ON CONFLICT (attempt_id, reporter) DO UPDATE SET seen_at = "
                           f"{later.format(t=table)}", params)
        return len(pairs)

class LedgerRow(models.Model):
    """Positions data-parallel ranks contributed to one committed update
    (docs/ingest-v1.md#update_committed). A row holds ``ranks`` consecutive ranks from ``rank``
    (``rank`` -1 stands for a null rank, always alone): one rank's report (``ranks`` 1), or a
    *folded* row of the reports of ranks ``rank .. rank + ranks - 1`` that are each the previous
    one's moved by ``rank_shift`` positions (the DistributedSampler shape; ``runs.folding``:
    ``spans`` are rank ``rank``'s, :meth:`parts` gives every rank's report exactly as sent).
    ``spans`` are the wire spans, which are already compact (ranges, strided ranges).

    ``time`` is the earliest of the row's ranks' report times (rows are joined across batches
    without comparing times: ``ingest.actions._Projection._join_stored``; the analysis keeps
    only the earliest report time per update).

    One row per ``(run, attempt, update, rank, ranks)``. Reports for a stored key are united: a
    later piece appends its spans (to a folded row only with the same ``rank_shift``: moving
    distributes over the union) and raises ``last_seq`` above ``first_seq``. A rank's report may
    also be in two rows (its own row and a folded one written by another batch): readers unite
    the reports of one ``(attempt, update, rank)`` whatever rows they come from, as the
    analysis core does (``recovery.ledger``).
    """

    # No index of its own on ``run``: ``uniq_ledger`` and ``ledger_run_seq`` begin with it (an
    # index kept up on every insert of the ingest path that no query needs).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="ledger_rows",
                            db_index=False)
    attempt = models.IntegerField()
    update = models.BigIntegerField()
    rank = models.IntegerField(default=GLOBAL_RANK)
    time = models.DateTimeField()
    spans = models.JSONField(default=list)
    samples = models.BigIntegerField(null=True, blank=True)
    tokens = models.BigIntegerField(null=True, blank=True)
    first_seq = models.BigIntegerField(default=0)
    last_seq = models.BigIntegerField(default=0)
    #: how many consecutive ranks from ``rank`` this row holds (runs.folding)
    ranks = models.IntegerField(default=1, db_default=1)
    #: positions rank ``rank + k``'s ranges are moved by, per k (0 for a row of one rank)
    rank_shift = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "attempt", "update", "rank", "ranks"],
                                    name="uniq_ledger")
        ]
        indexes = [models.Index(fields=["run", "last_seq"], name="ledger_run_seq")]

    def parts(self):
        """``(rank, spans)`` of every rank this row holds, in rank order (runs.folding.unfold:
        each exactly as that rank reported it)."""
        return unfold(self.rank, self.ranks, self.rank_shift, self.spans)

    def unite(self, spans: list[dict], samples: int | None, tokens: int | None, seq: int,
              time=None) -> None:
        """Unite a further report of the same ``(attempt, update, rank)`` into this row: spans
        not already present are appended (peers and re-sent reports add nothing), counts keep
        the larger value (tensor/pipeline peers repeat the same count), ``time`` the earlier of
        the row's and ``time`` (as :func:`rank_reports` and a joined row keep it: the result
        does not depend on which report arrived first), ``last_seq`` becomes the batch's seq
        while ``first_seq`` stays."""
        if time is not None and (self.time is None or time < self.time):
            self.time = time
        for span in spans:
            if span not in self.spans:
                self.spans.append(span)
        if samples is not None:
            self.samples = max(samples, self.samples or 0)
        if tokens is not None:
            self.tokens = max(tokens, self.tokens or 0)
        self.last_seq = seq


def rank_reports(rows) -> dict[tuple[int, int, int], dict]:
    """Every rank's report held by ``rows`` (LedgerRow objects, folded ones included):
    ``{(attempt, update, rank): {"time", "spans", "samples", "tokens"}}``, the reports of one key
    from several rows united as ``LedgerRow.unite`` unites them (spans appended when new, counts
    the larger, the earliest time). What the rows stand for, whatever the folding."""
    out: dict[tuple[int, int, int], dict] = {}
    for row in rows:
        for rank, spans in row.parts():
            key = (row.attempt, row.update, rank)
            mine = out.get(key)
            if mine is None:
                out[key] = {"time": row.time, "spans": list(spans), "samples": row.samples,
                            "tokens": row.tokens}
                continue
            mine["spans"] += [s for s in spans if s not in mine["spans"]]
            mine["time"] = min(mine["time"], row.time)
            for name in ("samples", "tokens"):
                value = getattr(row, name)
                if value is not None:
                    mine[name] = max(value, mine[name] or 0)
    return out


class Heartbeat(models.Model):
    """A liveness report with the read cursor (docs/ingest-v1.md#heartbeat). ``seq`` is the
    ingest seq of the batch that brought it (like ``LedgerRow.last_seq``): the analysis folds
    the heartbeats above the seq its state reflects into that state
    (``recovery.heartbeats.HeartbeatFold``), never the whole table."""

    # No index of its own on ``run``: both indexes below begin with it (an index kept up on
    # every insert of the ingest path that no query needs).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="heartbeats",
                            db_index=False)
    attempt = models.IntegerField()
    rank = models.IntegerField(null=True, blank=True)
    time = models.DateTimeField()
    update = models.BigIntegerField()
    fetched = models.JSONField(default=list, blank=True)
    seq = models.BigIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["run", "attempt", "time"], name="heartbeat_run_time"),
                   models.Index(fields=["run", "seq"], name="heartbeat_run_seq")]


class Generation(models.Model):
    """One checkpoint save (``generation_id``) with what was reported of it.

    ``manifest`` is the first committed manifest; ``manifest_conflict`` is set when a different
    one arrives for the same generation (``manifest_conflict``). ``status`` and ``reasons`` are
    written by the analysis (docs/definitions.md#generation-status).
    """

    STATUS_CHOICES = [(s, s) for s in ("pending", "committed", "restorable", "rejected",
                                       "abandoned")]

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="generations")
    generation_id = models.CharField(max_length=200)
    attempt = models.IntegerField(null=True, blank=True)
    update = models.BigIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    required_shards = models.JSONField(default=list, blank=True)
    components = models.JSONField(default=list, blank=True)
    committed_at = models.DateTimeField(null=True, blank=True)
    commit_reported_at = models.DateTimeField(null=True, blank=True)
    manifest = models.JSONField(null=True, blank=True)
    manifest_hash = models.CharField(max_length=64, blank=True, default="")
    manifest_conflict = models.BooleanField(default=False)
    conflicting_manifest = models.JSONField(null=True, blank=True)  # the second, different one
    discovered = models.BooleanField(default=False)  # found by listing storage
    # The folder (server-side URI) where discovery found the manifest: relative object URIs
    # resolve against it. Empty for a manifest that only came by event.
    found_at = models.CharField(max_length=2000, blank=True, default="")
    status = models.CharField(max_length=16, choices=STATUS_CHOICES, default="pending")
    reasons = models.JSONField(default=list, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)
    # The seq of the last write of anything the analysis reads of this generation: the row,
    # its shard reports, its objects and their storage results (ingest stamps the batch's seq;
    # a storage check that changes a result takes a seq of its own, runs.seq.mark_changed).
    # The analysis reads only the generations whose seq lies above the one it reflects.
    seq = models.BigIntegerField(db_default=0, default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "generation_id"], name="uniq_generation")
        ]
        indexes = [models.Index(fields=["run", "update"], name="generation_run_update"),
                   models.Index(fields=["run", "seq"], name="generation_run_seq")]

    def record_manifest(self, manifest: dict, manifest_hash: str, committed_at, reported_at,
                        attempt: int) -> bool:
        """Apply a ``checkpoint_committed`` manifest (docs/ingest-v1.md#checkpoint_committed). The
        first one is kept; a later one with other content sets ``manifest_conflict`` (neither is
        trusted, docs/definitions.md#restorable), the same one again changes nothing, also when
        it differs only in a volatile field such as ``committed_at`` (the first one's stays:
        docs/definitions.md#volatile-manifest-fields). Returns True when the generation changed
        (the analysis and verification must look at it again)."""
        if self.manifest is None:
            self.manifest = manifest
            self.manifest_hash = manifest_hash
            self.committed_at = committed_at
            self.commit_reported_at = reported_at
            if self.attempt is None:
                self.attempt = attempt
            update = manifest.get("update")
            if isinstance(update, int) and not isinstance(update, bool) and 0 <= update < 2**63:
                self.update = update
            for field in ("required_shards", "components"):
                value = manifest.get(field)
                if isinstance(value, list) and not getattr(self, field):
                    setattr(self, field, value)
            if self.status == "pending":
                self.status = "committed"
            return True
        if self.manifest_conflict or manifest_hash == self.manifest_hash \
                or same_manifest(self.manifest, manifest):
            return False  # docs/definitions.md#volatile-manifest-fields: the same manifest
        self.manifest_conflict = True
        self.conflicting_manifest = manifest
        return True


class ShardReport(models.Model):
    """A ``shard_written`` report: one shard of a generation, the update its state belongs to."""

    generation = models.ForeignKey(Generation, on_delete=models.CASCADE, related_name="shards")
    shard = models.CharField(max_length=200)
    update = models.BigIntegerField()
    object_list = models.JSONField(default=list)  # the wire ``objects`` of the report
    reported_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["generation", "shard"], name="uniq_shard_report")
        ]


class CheckpointObject(models.Model):
    """One object of a generation (Object, docs/ingest-v1.md#shard_written) and the result of
    checking it in storage.

    ``check_status``: ``pending`` (not checked yet), ``ok``, ``object_missing``,
    ``size_mismatch``, ``digest_mismatch``, ``storage_unverified`` (a scheme the server cannot
    read, or a check that could not finish), ``object_outside_locations`` (under none of the
    project's storage locations: never opened or requested), or ``error`` (a transient failure;
    checked again). ``uri`` is the manifest's, as written (it may be relative to the generation
    folder); ``resolved_uri`` what the server looked at (after resolution and path mapping).
    ``observed_size`` / ``observed_sha256`` are kept only for objects that verified ``ok``.
    ``check_attempts`` counts checks started and not finished (a worker killed, a time limit):
    past ``RECOVERYDASH_VERIFY_MAX_ATTEMPTS`` the object is not tried again.
    """

    CHECK_CHOICES = [(s, s) for s in ("pending", "ok", "object_missing", "size_mismatch",
                                      "digest_mismatch", "storage_unverified",
                                      "object_outside_locations", "error")]

    generation = models.ForeignKey(Generation, on_delete=models.CASCADE,
                                   related_name="checkpoint_objects")
    uri = models.CharField(max_length=2000)
    shard = models.CharField(max_length=200, blank=True, default="")
    component = models.CharField(max_length=200, blank=True, default="")
    size = models.BigIntegerField(null=True, blank=True)
    sha256 = models.CharField(max_length=64, blank=True, default="")
    update = models.BigIntegerField(null=True, blank=True)
    in_manifest = models.BooleanField(default=False)
    check_status = models.CharField(max_length=24, choices=CHECK_CHOICES, default="pending")
    check_detail = models.TextField(blank=True, default="")
    observed_size = models.BigIntegerField(null=True, blank=True)
    observed_sha256 = models.CharField(max_length=64, blank=True, default="")
    checked_at = models.DateTimeField(null=True, blank=True)
    resolved_uri = models.CharField(max_length=2000, blank=True, default="")
    check_started_at = models.DateTimeField(null=True, blank=True)
    check_attempts = models.IntegerField(default=0)
    #: While a task of its own reads the object's digest: bytes hashed so far, and when that
    #: task last said it is alive (it holds the object while this is recent); both cleared
    #: when the result is stored.
    hashed_bytes = models.BigIntegerField(default=0, db_default=0)
    hash_heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["generation", "uri"], name="uniq_checkpoint_object")
        ]


class AuditWindow(models.Model):
    """Readable sample identities around a checkpoint or resume
    (docs/ingest-v1.md#audit_window)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="audit_windows")
    attempt = models.IntegerField()
    update = models.BigIntegerField()
    rank = models.IntegerField()
    accum_slot = models.IntegerField()
    sample_ids = models.JSONField(default=list)
    time = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run", "attempt", "update"], name="audit_run_update")]


def clock_of(result: AnalysisResult | None, first_event_at=None) -> ClockFields:
    """The part of a stored analysis result that the core's
    ``figures.seconds_since_last_restorable`` reads: ``last_restorable`` (only its
    ``committed_at``), ``first_event_at`` (``first_event_at``, the run's, when the result has
    none) and ``ended_at``, each as POSIX seconds (``recovery.inputs.parse_time``) or None. A
    time the core cannot read is left out (None), as the figure would be unknown. With them,
    ``update_interval`` as the result has it (``recovery.figures.update_interval``: the newest
    attempt's median update interval, which the silence rules read; absent from a result stored
    before the core wrote it), and the result's ``undecided`` generations of the live lineage
    (``recovery.figures.undecided_generations``, their commit times as POSIX seconds; absent when
    there are none), ``live_attempt`` and ``newest_attempt`` as the result has them (the core's
    ``concurrency.stored_live_attempt`` reads them), so the periodic alert evaluation reads
    these few bytes per run (``alerts.evaluation.evaluate_chunk``)."""
    from recoverydash.recovery.inputs import parse_time

    def seconds(value):
        try:
            return parse_time(value)
        except (TypeError, ValueError, OverflowError):
            return None

    result = result if isinstance(result, dict) else {}
    last = result.get("last_restorable")
    committed = seconds(last.get("committed_at")) if isinstance(last, dict) else None
    clock: ClockFields = {
        "last_restorable": {"committed_at": committed} if committed is not None else None,
        "first_event_at": seconds(result.get("first_event_at") or first_event_at),
        "ended_at": seconds(result.get("ended_at"))}
    interval = result.get("update_interval")
    if isinstance(interval, dict):
        clock["update_interval"] = interval
    for key in ("live_attempt", "newest_attempt"):  # concurrency.stored_live_attempt reads them
        if type(result.get(key)) is int:
            clock[key] = result[key]
    live = [g for g in result.get("undecided") or [] if isinstance(g, dict) and g.get("live")]
    if live:  # what checkpoint_stale waits for (docs/definitions.md#settled-evidence)
        clock["undecided"] = [{**g, "committed_at": seconds(g.get("committed_at"))}
                              for g in live]
    return clock


def checkpoint_age_limit_of(contract) -> float | None:
    """The ``max_checkpoint_age_s`` a stored contract declares, in seconds, when it is a number
    (an int or float in the JSON); None otherwise (the default contract's limit applies)."""
    value = contract.get("max_checkpoint_age_s") if isinstance(contract, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def clock_columns(clock: dict) -> dict:
    """The stored columns of a ``clock_of`` dict that the fleet orders by in SQL:
    ``clock_since_s``, the time the core's ``seconds_since_last_restorable`` counts from (the last
    restorable commit, else the first event; None when neither is known), and ``clock_ended_s``,
    where that clock stops (the run's end; None while it runs). POSIX seconds."""
    clock = clock if isinstance(clock, dict) else {}
    committed = (clock.get("last_restorable") or {}).get("committed_at")
    return {"clock_since_s": committed if committed is not None else clock.get("first_event_at"),
            "clock_ended_s": clock.get("ended_at")}


class AnalysisManager(models.Manager):
    """``Analysis.objects``: rows read without their two blobs, ``state`` and ``inputs`` (they
    weigh what the run's history weighs and only the analysis reads them, by ``values_list``
    or on first access of the attribute): a reader of the result, the alert rules under the
    row's lock included, never transfers them."""

    def get_queryset(self):
        return super().get_queryset().defer("state", "inputs")


class Analysis(models.Model):
    """The stored analysis of a run: the recovery core's result and its incremental state.

    ``result`` holds the core's ``to_dict()`` (docs/ingest-v1.md#recovery fields, costs, chart
    series);
    ``state`` the core's serialised incremental state; ``ingest_seq`` the run's ingest seq the
    result reflects. Figures that depend on the current time (seconds since last restorable)
    are computed when read, from ``result``.
    """

    objects = AnalysisManager()

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="analysis")
    computed_at = models.DateTimeField(default=timezone.now)
    ingest_seq = models.BigIntegerField(default=0)
    duration_s = models.FloatField(default=0.0)
    health = models.CharField(max_length=16, default="ok")
    result = models.JSONField(default=dict)
    # The keys of ``result`` that ``recovery.figures.seconds_since_last_restorable`` reads
    # (``clock_of``), kept beside it on every save: the fleet reads these few bytes per run
    # instead of the whole result with its chart series.
    clock = models.JSONField(default=dict, blank=True)
    # ``clock`` as two numbers (``clock_columns``), written with it: what the fleet's attention
    # order computes the at-risk ratio from in SQL (dashboard.queries.fleet).
    clock_since_s = models.FloatField(null=True, blank=True)
    clock_ended_s = models.FloatField(null=True, blank=True)
    # The last analysis that failed for a reason retrying cannot fix (a malformed input the core
    # refuses): its message and the ingest seq it was attempted at. The sweep does not retry a
    # run until new events arrive; the read API and dashboard show the message.
    error = models.TextField(blank=True, default="")
    error_at = models.DateTimeField(null=True, blank=True)
    error_seq = models.BigIntegerField(default=-1)
    state = models.BinaryField(null=True, blank=True)
    # The format of ``state`` (recovery.ledger.STATE_FORMAT when written), and when raw rows it
    # had absorbed were first deleted (runs.compaction, docs/retention.md): from then on the
    # state is the only record of them, and it is never rebuilt from the rows that are left.
    state_format = models.IntegerField(default=0)
    compacted_at = models.DateTimeField(null=True, blank=True)
    # The run's attempts, restores and generations as the core reads them (runs.analysis
    # ``StoredInputs``, format 4: the head, a light entry per generation; the full entries in
    # ``InputChunk`` rows, the first occurrence of each state digest in ``InputDigest`` rows,
    # docs/retention.md#stored-inputs), as of ``ingest_seq``: each analysis reads only the
    # Attempt and Generation rows whose seq lies above it and replaces those.
    inputs = models.BinaryField(null=True, blank=True)
    # What the clock-driven figures of ``result`` are recomputed from at a later time with
    # nothing new (``recovery.clock_basis``; None: an analysis before it, or none to keep):
    # such an analysis reads neither ``state`` nor ``inputs`` (runs.analysis).
    clock_basis = models.JSONField(null=True, blank=True)

    class Meta:
        # ``run.analysis`` (a related access) defers the blobs too (AnalysisManager)
        base_manager_name = "objects"

    def save(self, *args, **kwargs):
        """Save, with ``clock`` derived from ``result`` (``clock_of``) and its columns
        (``clock_columns``)."""
        result = self.result if isinstance(self.result, dict) else {}
        first = None if result.get("first_event_at") else self.run.first_event_at
        self.clock = clock_of(result, first)
        for name, value in clock_columns(self.clock).items():
            setattr(self, name, value)
        fields = kwargs.get("update_fields")
        if fields is not None and "result" in fields:
            kwargs["update_fields"] = list(fields) + ["clock", "clock_since_s", "clock_ended_s"]
        super().save(*args, **kwargs)


class StateBlock(models.Model):
    """One block of a stored ledger state's per-update times (``recovery.Ledger.to_parts``,
    state format 6): the chunks of attempt ``attempt`` whose index >> ``TIME_BLOCK_SHIFT`` is
    ``block`` (4,096 updates, at most 32 KiB), as raw bytes. ``Analysis.state`` holds the head;
    an analysis writes the head and only the blocks that changed, so what it writes does not
    grow with the run's history. Deleted with the Analysis row, and replaced whole when the
    state is rebuilt."""

    analysis = models.ForeignKey(Analysis, on_delete=models.CASCADE, related_name="blocks")
    attempt = models.IntegerField()
    block = models.BigIntegerField()
    data = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["analysis", "attempt", "block"],
                                               name="uniq_state_block")]


class InputChunk(models.Model):
    """One chunk of a stored analysis's generation entries (``runs.analysis.StoredInputs``,
    inputs format 4): the entries of the generations whose pk // ``GENERATION_CHUNK`` is
    ``chunk``, zlib-compressed JSON ``{pk: entry}``. ``Analysis.inputs`` holds the head (a
    light entry per generation); an analysis reads a chunk only when one of its generations
    changed or the core reads a heavy field of one (its manifest's objects, shard reports,
    storage results), and writes only the chunks that changed. Deleted with the Analysis row,
    replaced whole when the inputs are rebuilt."""

    analysis = models.ForeignKey(Analysis, on_delete=models.CASCADE, related_name="input_chunks")
    chunk = models.BigIntegerField()
    data = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["analysis", "chunk"],
                                               name="uniq_input_chunk")]


class InputDigest(models.Model):
    """The first generation (lowest update, then generation id) whose ``model`` or
    ``optimizer`` object carries a digest, per digest of a stored analysis's generations
    (``runs.analysis.StoredInputs``, docs/definitions.md#stale-state-and-stateless-optimizers):
    ``key`` the signed 64-bit head of blake2b(component NUL sha256), ``update`` and
    ``generation`` (the Generation pk) of that first occurrence. A new generation's digests are
    looked up here (a hit is confirmed against that generation's objects), so judging it does
    not read the older generations' objects. Deleted with the Analysis row, replaced whole when
    every generation is compared again."""

    analysis = models.ForeignKey(Analysis, on_delete=models.CASCADE, related_name="input_digests")
    key = models.BigIntegerField()
    update = models.BigIntegerField()
    generation = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["analysis", "key"],
                                               name="uniq_input_digest")]
