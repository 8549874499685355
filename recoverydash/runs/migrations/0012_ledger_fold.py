from django.db import migrations, models


class Migration(migrations.Migration):
    """Folded ledger rows (runs.folding): ``ranks`` consecutive ranks from ``rank`` in one row,
    each rank's ranges moved by ``rank_shift``; existing rows hold one rank (the defaults). The
    unique key gains ``ranks`` so that a rank's own row and a folded row starting at it can both
    be stored (readers unite them)."""

    dependencies = [
        ('runs', '0011_fleet_order_columns'),
    ]

    operations = [
        migrations.AddField(
            model_name='ledgerrow',
            name='ranks',
            field=models.IntegerField(db_default=1, default=1),
        ),
        migrations.AddField(
            model_name='ledgerrow',
            name='rank_shift',
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.RemoveConstraint(
            model_name='ledgerrow',
            name='uniq_ledger',
        ),
        migrations.AddConstraint(
            model_name='ledgerrow',
            constraint=models.UniqueConstraint(fields=('run', 'attempt', 'update', 'rank', 'ranks'),
                                               name='uniq_ledger'),
        ),
    ]
