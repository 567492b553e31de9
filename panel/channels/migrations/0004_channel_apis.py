from django.db import migrations, models


def local_channels_speak_both(apps, schema_editor):
    # A local vLLM deployment serves /v1/messages beside /v1/chat/completions.
    apps.get_model("channels", "Channel").objects.filter(kind="local").update(apis="both")


class Migration(migrations.Migration):

    dependencies = [
        ('channels', '0003_time_budgets'),
    ]

    operations = [
        migrations.AddField(
            model_name='channel',
            name='apis',
            field=models.CharField(choices=[('chat', 'OpenAI chat'),
                                            ('messages', 'Anthropic Messages'),
                                            ('both', 'Both')], default='chat', max_length=10),
        ),
        migrations.AddField(
            model_name='channel',
            name='price_cache_write_per_million',
            field=models.DecimalField(blank=True, decimal_places=6, max_digits=12, null=True),
        ),
        migrations.RunPython(local_channels_speak_both, migrations.RunPython.noop),
    ]
