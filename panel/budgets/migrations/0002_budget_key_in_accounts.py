# TeamKey moved to the accounts app with its table unchanged: only Django's state of this foreign key moves.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0002_teamkey'),
        ('budgets', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='budget',
                    name='key',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='accounts.teamkey'),
                ),
            ],
            database_operations=[],
        ),
    ]
