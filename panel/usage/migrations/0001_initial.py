# RequestLog moves here from the gateway app. Its table stays where the gateway created it (gateway_requestlog):
# the move changes Django's state only, and not one row or column.

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('accounts', '0002_teamkey'),
        ('channels', '0002_route_canary'),
        ('gateway', '0003_requestlog_rate_limited_attempts'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='RequestLog',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('created_at', models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                        ('endpoint', models.CharField(max_length=40)),
                        ('model', models.CharField(max_length=200)),
                        ('stream', models.BooleanField(default=False)),
                        ('status_code', models.PositiveSmallIntegerField()),
                        ('outcome', models.CharField(max_length=20)),
                        ('error_kind', models.CharField(blank=True, max_length=40)),
                        ('attempts', models.PositiveSmallIntegerField(default=0)),
                        ('rate_limited_attempts', models.PositiveSmallIntegerField(blank=True, null=True)),
                        ('fell_back', models.BooleanField(default=False)),
                        ('prompt_tokens', models.PositiveIntegerField(default=0)),
                        ('completion_tokens', models.PositiveIntegerField(default=0)),
                        ('cached_tokens', models.PositiveIntegerField(default=0)),
                        ('ttft_ms', models.FloatField(blank=True, null=True)),
                        ('latency_ms', models.FloatField()),
                        ('cost', models.DecimalField(decimal_places=8, default=0, max_digits=14)),
                        ('json_requested', models.BooleanField(default=False)),
                        ('json_valid', models.BooleanField(blank=True, null=True)),
                        ('system_prompt_hash', models.CharField(blank=True, default='', max_length=16)),
                        ('system_prompt_shape_hash', models.CharField(blank=True, default='', max_length=16)),
                        ('canary', models.BooleanField(blank=True, null=True)),
                        ('channel', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='channels.channel')),
                        ('key', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='accounts.teamkey')),
                        ('route', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='channels.route')),
                        ('team', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='accounts.team')),
                    ],
                    options={
                        'ordering': ['-created_at'],
                        'db_table': 'gateway_requestlog',
                        'indexes': [models.Index(fields=['team', 'created_at'], name='gateway_req_team_id_333225_idx')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
