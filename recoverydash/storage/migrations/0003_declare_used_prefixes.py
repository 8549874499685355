"""Existing deployments: declare, as storage locations, the prefixes their stored generations
already use, so nothing that verified before stops verifying now that objects are read only
under a project's declared locations.

- Locations declared before without keys used the server's ambient credentials: they keep them
  (``use_ambient_credentials``).
- For every object that verified ``ok``, the folder (or S3 prefix) its generation was saved in
  (the part of its URI before the generation folder, else the object's own folder) is declared
  for its project unless a location already covers it (``origin`` ``migration``; ``discover``
  off, so nothing new is listed; S3 prefixes with the ambient credentials they were verified
  with). The file system root, system folders and folders holding the server's own files are
  never declared.
- What was observed of objects that failed (size, digest) is forgotten, and their details are
  reworded without it: it is never shown to users.
"""

import os
import re
import types
from collections import defaultdict
from urllib.parse import unquote, urlparse

from django.conf import settings
from django.db import migrations

# Frozen here: a migration never imports live product code, whose later edits would change what
# this migration does to a database that applies it then. What it used of the path rules
# (recoverydash.checkpoints.paths, storage/paths.py before it) as they were when this migration
# was frozen (issue 30); do not update them when those change.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_]{1,254}$")
_SYSTEM_FOLDERS = ("/proc", "/sys", "/dev", "/etc", "/boot", "/run", "/root", "/var/run")


class _UnsafeURI(ValueError):
    """A URI that has no canonical form."""


def _scheme_of(uri):
    if uri.startswith("/"):
        return "file"
    m = _SCHEME.match(uri)
    return m.group(0)[:-1].lower() if m else ""


def _clean_path(path):
    if "\x00" in path:
        raise _UnsafeURI("a path with a NUL byte")
    path = "/" + path.lstrip("/")
    path = os.path.normpath(re.sub(r"/{2,}", "/", path))
    return "/" + path.lstrip("/")


def _canonical(uri):
    """``file:///abs/path`` (decoded once, slashes collapsed, dot segments resolved, local host
    only) or ``s3://bucket/key`` (no dot segments, a well-formed bucket); other schemes as they
    are. Raises _UnsafeURI."""
    if not isinstance(uri, str) or not uri:
        raise _UnsafeURI(f"expected a URI, got {uri!r}")
    scheme = _scheme_of(uri)
    if scheme == "file":
        if uri.startswith("/"):
            path = uri
        else:
            u = urlparse(uri)
            if u.netloc not in ("", "localhost"):
                raise _UnsafeURI(f"a file URI on another host ({u.netloc!r}) is not local")
            if u.query or u.fragment:
                raise _UnsafeURI("a file URI with a query or fragment")
            path = u.path
        return "file://" + _clean_path(unquote(path))
    if scheme == "s3":
        rest = uri.split("://", 1)[1] if "://" in uri else ""
        bucket, _, key = rest.partition("/")
        if not _BUCKET.match(bucket):
            raise _UnsafeURI(f"not an S3 bucket name: {bucket!r}")
        for seg in key.split("/"):
            if unquote(seg) in (".", ".."):
                raise _UnsafeURI(f"an S3 key with a {unquote(seg)!r} segment")
        if "\x00" in key:
            raise _UnsafeURI("an S3 key with a NUL byte")
        return f"s3://{bucket}/{key}"
    if not scheme:
        raise _UnsafeURI(f"a relative URI needs a base: {uri!r}")
    return uri


def _rest_under(uri, prefix):
    base = prefix.rstrip("/")
    if uri.rstrip("/") == base:
        return ""
    if uri.startswith(base + "/"):
        return uri[len(base) + 1:]
    return None


def _is_unsafe_folder(path, protected):
    if path == "/":
        return "the file system root"
    for folder in _SYSTEM_FOLDERS:
        if path == folder or path.startswith(folder + "/"):
            return f"the system folder {folder}"
    for p in protected:
        p = os.path.realpath(p)
        if p == path or p.startswith(path.rstrip("/") + "/"):
            return f"a folder that holds the server's own files ({p})"
    return None


paths = types.SimpleNamespace(canonical=_canonical, UnsafeURI=_UnsafeURI,
                              file_path=lambda canonical_uri: canonical_uri[len("file://"):],
                              rest_under=_rest_under, is_unsafe_folder=_is_unsafe_folder)


def used_prefix(uri: str, generation_id: str) -> str | None:
    """The location a verified object's generation lived in, canonical, or None."""
    try:
        canon = paths.canonical(uri)
    except paths.UnsafeURI:
        return None
    if canon.startswith("s3://"):
        bucket, _, key = canon[len("s3://"):].partition("/")
        head, segments = f"s3://{bucket}", key.split("/")
    elif canon.startswith("file://"):
        head, segments = "file://", paths.file_path(canon).strip("/").split("/")
    else:
        return None
    folders = segments[:-1]
    if generation_id in folders:
        folders = folders[:len(folders) - 1 - folders[::-1].index(generation_id)]
    prefix = head + "/" + "/".join(folders) if folders else head + ("/" if head == "file://"
                                                                    else "")
    return prefix.rstrip("/") if prefix != "file:///" else prefix


def forwards(apps, schema_editor):
    Location = apps.get_model("storage", "StorageLocation")
    CheckpointObject = apps.get_model("runs", "CheckpointObject")
    Location.objects.filter(url__startswith="s3://", access_key_id="", role_arn="").update(
        use_ambient_credentials=True)

    per_project = defaultdict(set)
    rows = (CheckpointObject.objects.filter(in_manifest=True, check_status="ok")
            .values_list("generation__run__project_id", "uri", "generation__generation_id"))
    for project_id, uri, generation_id in rows.iterator():
        prefix = used_prefix(uri, generation_id)
        if prefix:
            per_project[project_id].add(prefix)
    protected = [str(settings.VAR_DIR), str(settings.BASE_DIR)]
    for project_id, prefixes in per_project.items():
        covered = []
        for url in Location.objects.filter(project_id=project_id).values_list("url", flat=True):
            try:
                covered.append(paths.canonical(url))
            except paths.UnsafeURI:
                continue
        for prefix in sorted(prefixes, key=len):  # the shortest first: it covers the longer
            if any(paths.rest_under(prefix, c) is not None for c in covered):
                continue
            if prefix.startswith("file://") and \
                    paths.is_unsafe_folder(paths.file_path(prefix), protected):
                continue
            Location.objects.create(project_id=project_id, url=prefix, origin="migration",
                                    discover=False,
                                    use_ambient_credentials=prefix.startswith("s3://"))
            covered.append(prefix)

    failed = CheckpointObject.objects.exclude(check_status__in=("ok", "pending"))
    failed.update(observed_size=None, observed_sha256="")
    failed.filter(check_status="digest_mismatch").update(
        check_detail="sha256 differs from the manifest's")
    for pk, size in failed.filter(check_status="size_mismatch").values_list("pk", "size"):
        CheckpointObject.objects.filter(pk=pk).update(
            check_detail=f"the size differs from the manifest's {size} bytes")


class Migration(migrations.Migration):

    dependencies = [
        ("storage", "0002_storage_confinement"),
        ("runs", "0005_storage_confinement"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
