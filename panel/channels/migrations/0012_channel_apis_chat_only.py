# A channel may speak OpenAI chat completions without the Responses API (decision 0093): "chat_only". Existing
# channels keep what they had: "chat" and "both" still pass /v1/responses through.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('channels', '0011_canary_hold'),
    ]

    operations = [
        migrations.AlterField(
            model_name='channel',
            name='apis',
            field=models.CharField(choices=[
                ('chat', 'OpenAI chat completions and Responses'),
                ('chat_only', 'OpenAI chat completions only (Responses translated)'),
                ('messages', 'Anthropic Messages'),
                ('both', 'OpenAI and Anthropic Messages (a local vLLM)')], default='chat', max_length=10),
        ),
    ]
