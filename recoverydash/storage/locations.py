"""A project's storage locations as the only way to storage.

``Locations(project)`` resolves a manifest object's URI to what the server may read: a relative
URI is joined to its generation folder, a trainer path is mapped to the server's
(``StorageLocation.trainer_url`` -> ``url``), the result is put in canonical form (``..``,
``%2e``, duplicate slashes, ``file://localhost``, symbolic links resolved) and must lie under an
enabled location of the project, both as written and with links resolved. Anything else is
refused with a sentence, stored as ``object_outside_locations`` and never opened or requested.
Each location brings its own S3 client (its endpoint, region, keys or role; the server's ambient
credentials only with ``use_ambient_credentials``).

``check_location`` is the rule for declaring one (the dashboard form, ``manage.py
add_location``, the admin): an absolute ``file://`` folder that is not the root, a system folder
or a folder holding the server's own files, or an ``s3://bucket[/prefix]``; a location of kind
``adopt`` names a known format or ``auto`` (``check_kind``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.conf import settings

from recoverydash.checkpoints import paths
from recoverydash.checkpoints.objects import PermanentStorageError, make_s3_client
from recoverydash.storage.models import StorageLocation

#: The wire contract's run id (docs/ingest-v1.md#identifiers): a location's run must be one
#: ingest takes (which also refuses ``.`` and ``..``: no URL can address them).
RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class LocationRefused(ValueError):
    """A location that may not be declared; ``field`` names the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def protected_paths() -> list[str]:
    """Paths no file location may hold: the server's data folder, its code, its database."""
    out = [str(settings.VAR_DIR), str(settings.BASE_DIR)]
    name = settings.DATABASES["default"].get("NAME")
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3") and name:
        out.append(str(name))
    return out


def normal_location(url: str) -> str:
    """A location URI in canonical form without a trailing slash (a plain absolute path becomes
    ``file://``). Raises LocationRefused."""
    url = (url or "").strip()
    scheme = paths.scheme_of(url) if url else ""
    if scheme not in ("file", "s3"):
        raise LocationRefused("url", "expected file:///absolute/folder or s3://bucket/prefix, "
                                     f"got {url!r}")
    try:
        canon = paths.canonical(url)
    except paths.UnsafeURI as exc:
        raise LocationRefused("url", f"{url!r}: {exc}") from None
    return canon.rstrip("/") if canon != "file:///" else canon


def check_location(location: StorageLocation) -> tuple[str, str]:
    """``(url, trainer_url)`` of a location in canonical form, or LocationRefused: a file folder
    that is the root, a system folder or one holding the server's own files (checked as written
    and with links resolved), a role or keys on a file location, half a key pair."""
    url = normal_location(location.url)
    trainer = ""
    if location.trainer_url.strip():
        trainer_raw = location.trainer_url.strip()
        if paths.scheme_of(trainer_raw) not in ("file", "s3"):
            raise LocationRefused("trainer_url", "the trainers' prefix must be file:///... or "
                                                 f"s3://..., got {trainer_raw!r}")
        try:
            trainer = paths.canonical(trainer_raw).rstrip("/")
        except paths.UnsafeURI as exc:
            raise LocationRefused("trainer_url", str(exc)) from None
    if url.startswith("file://"):
        for form in (url, paths.canonical(url, real=True)):
            why = paths.is_unsafe_folder(paths.file_path(form), protected_paths())
            if why:
                raise LocationRefused("url", f"{url} may not be a storage location: it is {why}")
        if location.access_key_id or location.secret_access_key or location.role_arn:
            raise LocationRefused("access_key_id", "keys and roles are for s3:// locations")
    check_kind(location.kind, location.format)
    if location.run_id and (not RUN_ID.fullmatch(location.run_id)
                            or location.run_id in (".", "..")):
        raise LocationRefused("run_id", "expected a run id of 1-128 characters from A-Z a-z "
                                        f"0-9 . _ : -, not '.' or '..', got "
                                        f"{location.run_id[:140]!r}")
    if bool(location.access_key_id) != bool(location.secret_access_key):
        raise LocationRefused("secret_access_key", "give both the access key id and the secret")
    if location.endpoint_url and not location.endpoint_url.startswith(("http://", "https://")):
        raise LocationRefused("endpoint_url", "the endpoint must be an http(s):// URL")
    return url, trainer


def check_kind(kind: str, fmt: str) -> None:
    """A location of kind ``adopt`` names the format of the checkpoints it holds: one of
    ``recoverydash.checkpoints.formats.ADAPTERS`` (``dcp``, ``hf``, ``lightning``, ``deepspeed``,
    ``megatron``, ``orbax``), or ``auto`` / empty to detect it at each listing; a ``manifests``
    location names none. Raises LocationRefused (field ``format`` or ``kind``)."""
    from recoverydash.checkpoints.formats import ADAPTERS
    from recoverydash.storage.models import KIND_ADOPT, KIND_MANIFESTS

    if kind not in (KIND_ADOPT, KIND_MANIFESTS):
        raise LocationRefused("kind", f"kind must be {KIND_MANIFESTS} or {KIND_ADOPT}, got "
                                      f"{kind!r}")
    if kind == KIND_ADOPT and fmt not in ("", "auto", *ADAPTERS):
        raise LocationRefused("format", f"format must be auto or one of "
                                        f"{', '.join(ADAPTERS)}, got {fmt!r}")
    if kind == KIND_MANIFESTS and fmt:
        raise LocationRefused("format", "a format is for adopt locations (checkpoints of "
                                        f"another tool); a manifests location names none, "
                                        f"got {fmt!r}")


@dataclass(frozen=True)
class Resolved:
    """Where one object URI leads. ``uri``: canonical, links resolved (what is read), or the URI
    as given for a scheme the server cannot read (``unverifiable``). ``location``: the covering
    location. ``root``: its folder, links resolved (files are opened beneath it). ``refused``:
    why it is outside the locations (then nothing is read)."""

    uri: str
    location: StorageLocation | None = None
    root: str | None = None
    refused: str = ""
    unverifiable: bool = False


class Locations:
    """The storage locations of one project, ready to resolve object URIs and hand out clients.

    Built once per verification (prefixes with links resolved are taken at that moment).
    ``timeouts``: ``(connect, read)`` seconds of its S3 clients, which then try once (the
    re-check at the moment of a question keeps within its time budget); default 5 s, 30 s and
    three tries."""

    def __init__(self, project_id: int, rows: list[StorageLocation] | None = None, *,
                 timeouts: tuple[float, float] | None = None):
        self.project_id = project_id
        self.timeouts = timeouts
        self.rows = rows if rows is not None else list(
            StorageLocation.objects.filter(project_id=project_id))
        self._prefixes = []
        for loc in self.rows:
            try:
                written = paths.canonical(loc.url)
                real = paths.canonical(loc.url, real=True)
            except paths.UnsafeURI:
                continue
            self._prefixes.append((loc, written, real))
        # the most specific location first: its credentials apply to what lies under it
        self._prefixes.sort(key=lambda t: -len(t[2]))
        self._maps = sorted(((loc.trainer_url, loc.url) for loc in self.rows
                             if loc.enabled and loc.trainer_url),
                            key=lambda t: -len(t[0]))
        self._clients: dict = {}

    def map_trainer(self, uri: str) -> str:
        """``uri`` rewritten from a trainer's prefix to the server's (the longest matching
        ``trainer_url`` wins); unchanged when none matches."""
        for source, target in self._maps:
            try:
                mapped = paths.map_prefix(uri, source, target)
            except paths.UnsafeURI:
                return uri
            if mapped is not None:
                return mapped
        return uri

    def resolve(self, uri: str, base: str | None = None, base_is_server: bool = False, *,
                uri_is_server: bool = False) -> Resolved:
        """Resolve an object URI of a manifest (see the module docstring). ``base``: the
        generation folder that relative URIs are joined to; ``base_is_server``: it is already a
        server-side URI (where discovery found the manifest), so no trainer mapping applies to
        what is joined to it; ``uri_is_server``: an absolute ``uri`` is the server's own (a
        listing's), not a trainer's. Never touches storage except to resolve symbolic links of a
        path that lies under a location as written."""
        try:
            absolute = paths.resolve(uri, base)
        except paths.UnsafeURI as exc:
            return Resolved(uri, refused=f"{exc}: never read")
        server_side = base_is_server if paths.is_relative(uri) else uri_is_server
        if not server_side:
            absolute = self.map_trainer(absolute)
        scheme = paths.scheme_of(absolute)
        if scheme not in ("file", "s3"):
            return Resolved(uri, unverifiable=True)
        try:
            written = paths.canonical(absolute)
        except paths.UnsafeURI as exc:
            return Resolved(uri, refused=f"{absolute}: {exc}; never read")
        candidates = [(loc, real) for loc, w, real in self._prefixes
                      if paths.rest_under(written, w) or paths.rest_under(written, real)]
        if not candidates:
            return Resolved(written, refused=self._outside(absolute))
        try:
            real_uri = paths.canonical(written, real=True) if scheme == "file" else written
        except (paths.UnsafeURI, OSError) as exc:
            return Resolved(written, refused=f"{absolute}: {exc}; never read")
        for loc, _, real in self._prefixes:
            if paths.rest_under(real_uri, real):
                if not loc.enabled:
                    return Resolved(real_uri, refused=f"{absolute} lies under the storage "
                                                      f"location {loc.url}, which is disabled: "
                                                      "never read")
                root = paths.file_path(real) if scheme == "file" else None
                return Resolved(real_uri, location=loc, root=root)
        return Resolved(real_uri, refused=f"{absolute} leads out of the storage location "
                                          f"{candidates[0][0].url} (a symbolic link): never read")

    def _outside(self, absolute: str) -> str:
        declared = ", ".join(loc.url for loc in self.rows[:5]) or "none declared"
        return (f"{absolute} is under none of the project's storage locations ({declared}): "
                "never read. Declare its folder or prefix as a storage location if it is yours")

    def client(self, location: StorageLocation):
        """The S3 client of ``location`` (cached): its endpoint, region and keys, or its role;
        the server's ambient credentials only when it says ``use_ambient_credentials``.
        Raises PermanentStorageError when it has no credentials of its own and may not use the
        ambient ones, or TransientStorageError / PermanentStorageError from assuming its role."""
        if location.pk not in self._clients:
            extra = {} if self.timeouts is None else {
                "connect_timeout": self.timeouts[0], "read_timeout": self.timeouts[1],
                "max_attempts": 1}
            try:
                self._clients[location.pk] = make_s3_client(
                    **extra,
                    endpoint_url=location.endpoint_url or None, region=location.region or None,
                    access_key_id=location.access_key_id or None,
                    secret_access_key=location.secret_access_key or None,
                    role_arn=location.role_arn or None, external_id=location.external_id or None,
                    only_given=not location.use_ambient_credentials)
            except PermanentStorageError as exc:
                self._clients[location.pk] = exc
        client = self._clients[location.pk]
        if isinstance(client, Exception):
            raise PermanentStorageError(f"storage location {location.url}: {client}")
        return client


def location_client(location: StorageLocation):
    """The S3 client of one location (see ``Locations.client``); None for a file location."""
    if location.scheme != "s3":
        return None
    return Locations(location.project_id, [location]).client(location)


def clean_location(location: StorageLocation) -> None:
    """Normalise ``url`` and ``trainer_url`` of an unsaved or edited location in place, or
    raise ValidationError naming the field (``check_location``)."""
    from django.core.exceptions import ValidationError

    try:
        location.url, location.trainer_url = check_location(location)
    except LocationRefused as exc:
        raise ValidationError({exc.field: str(exc)}) from None


def declare_location(project, *, origin: str, **fields) -> tuple[StorageLocation, bool]:
    """Create or update the location ``fields["url"]`` of ``project`` (validated and normalised
    by ``clean_location``); returns ``(location, created)``. Raises ValidationError. The
    project's objects found outside its locations are verified again once it is saved
    (``recoverydash.storage.apps``)."""
    from django.db import transaction

    probe = StorageLocation(project=project, **fields)
    clean_location(probe)
    with transaction.atomic():
        location = StorageLocation.objects.filter(project=project, url=probe.url).first()
        created = location is None
        if created:
            location = probe
            location.origin = origin
        else:
            for name, value in fields.items():
                setattr(location, name, value)
            location.url, location.trainer_url = probe.url, probe.trainer_url
        location.save()
    return location, created
