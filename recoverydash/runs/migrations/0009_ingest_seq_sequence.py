from django.db import migrations


def create_sequence(apps, schema_editor):
    """PostgreSQL: the sequence batches take their seq from (recoverydash.runs.seq), started
    above every seq stamped so far (runs counted their batches before), so rows stamped from now
    on sort after every older row of each run."""
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("CREATE SEQUENCE IF NOT EXISTS recoverydash_ingest_seq AS bigint")
        cursor.execute("SELECT setval('recoverydash_ingest_seq', "
                       "GREATEST(1, (SELECT COALESCE(MAX(ingest_seq), 0) FROM runs_run)))")


def drop_sequence(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("DROP SEQUENCE IF EXISTS recoverydash_ingest_seq")


class Migration(migrations.Migration):
    """The ingest seq without a lock per run: batches take it from one PostgreSQL sequence under
    a shared advisory lock of their runs (recoverydash.runs.seq)."""

    dependencies = [
        ('runs', '0008_drills'),
    ]

    operations = [
        migrations.RunPython(create_sequence, drop_sequence),
    ]
