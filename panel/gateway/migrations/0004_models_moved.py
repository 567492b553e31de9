# TeamKey moved to the accounts app and RequestLog to the usage app, each with its table unchanged: the gateway app
# keeps no models. State only: not one row or column changes.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('gateway', '0003_requestlog_rate_limited_attempts'),
        ('usage', '0001_initial'),
        ('budgets', '0002_budget_key_in_accounts'),
        ('dashboards', '0002_usagerollup_key_in_accounts'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name='RequestLog'),
                migrations.DeleteModel(name='TeamKey'),
            ],
            database_operations=[],
        ),
    ]
