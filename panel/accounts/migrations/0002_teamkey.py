# TeamKey moves here from the gateway app. Its table stays where the gateway created it (gateway_teamkey): the move
# changes Django's state only, and not one row or column.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0001_initial'),
        ('gateway', '0003_requestlog_rate_limited_attempts'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='TeamKey',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=100)),
                        ('key_hash', models.CharField(max_length=64, unique=True)),
                        ('last4', models.CharField(max_length=4)),
                        ('allowed_models', models.JSONField(blank=True, default=list)),
                        ('rpm_limit', models.PositiveIntegerField(blank=True, null=True)),
                        ('tpm_limit', models.PositiveIntegerField(blank=True, null=True)),
                        ('expires_at', models.DateTimeField(blank=True, null=True)),
                        ('revoked_at', models.DateTimeField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('last_used_at', models.DateTimeField(blank=True, null=True)),
                        ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('team', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='keys', to='accounts.team')),
                    ],
                    options={
                        'ordering': ['-created_at'],
                        'db_table': 'gateway_teamkey',
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
