from django.db import migrations, models


class Migration(migrations.Migration):
    """``Analysis.clock_basis``: what an analysis with nothing new recomputes the clock-driven
    figures from (``recovery.clock_basis``). Null on existing rows: their next analysis is a
    full one and writes it. Related accesses (``run.analysis``) go through
    ``AnalysisManager``, which defers the ``state`` and ``inputs`` blobs."""

    dependencies = [("runs", "0014_rank_seen")]

    operations = [
        migrations.AddField(model_name="analysis", name="clock_basis",
                            field=models.JSONField(blank=True, null=True)),
        migrations.AlterModelOptions(name="analysis", options={"base_manager_name": "objects"}),
    ]
