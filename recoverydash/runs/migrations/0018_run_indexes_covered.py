"""The ``run`` foreign keys of Event, LedgerRow and Heartbeat lose their index of their own:
every other index of those tables begins with ``run`` (``uniq_event`` and ``event_run_type``;
``uniq_ledger`` and ``ledger_run_seq``; ``heartbeat_run_time`` and ``heartbeat_run_seq``), so
the single-column index answered no query the others do not, and cost a third index insertion
per row of the ingest path.

The database side only drops the three indexes (names as Django made them, the same on every
installation): Django's own AlterField would drop and add the foreign key again, which
re-checks every stored row under a lock (on PostgreSQL) or rebuilds the table (on SQLite).
Reversed, the indexes are made again.
"""

import django.db.models.deletion
from django.db import migrations, models

#: (table, the index Django made for its ``run_id`` column)
COVERED = (("runs_event", "runs_event_run_id_9278d2f7"),
           ("runs_heartbeat", "runs_heartbeat_run_id_319f0ae7"),
           ("runs_ledgerrow", "runs_ledgerrow_run_id_c98ddc2b"))


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0017_input_chunk'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name=model,
                    name='run',
                    field=models.ForeignKey(db_index=False,
                                            on_delete=django.db.models.deletion.CASCADE,
                                            related_name=related, to='runs.run'),
                )
                for model, related in (('event', 'events'), ('heartbeat', 'heartbeats'),
                                       ('ledgerrow', 'ledger_rows'))
            ],
            database_operations=[
                migrations.RunSQL(f'DROP INDEX IF EXISTS "{index}"',
                                  reverse_sql=f'CREATE INDEX IF NOT EXISTS "{index}" ON '
                                              f'"{table}" ("run_id")')
                for table, index in COVERED
            ],
        ),
    ]
