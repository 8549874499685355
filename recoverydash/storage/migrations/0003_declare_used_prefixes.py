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

from collections import defaultdict

from django.conf import settings
from django.db import migrations


def used_prefix(uri: str, generation_id: str) -> str | None:
    """The location a verified object's generation lived in, canonical, or None."""
    from recoverydash.checkpoints import paths

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
    from recoverydash.checkpoints import paths

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
