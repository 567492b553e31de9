"""Usage rows written before metadata.user_id was stored as its keyed hash hold client-named session ids as sent.
An id from the x-session-id header cannot be told from a user id on an old row, so every client-named id ("p-" ids
are the panel's own) becomes its keyed hash (gateway/sessions.py:user_session_id): rows of one session stay
together, and a user id that named a person is gone."""
from django.db import migrations


def hash_client_named_ids(apps, schema_editor):
    from panel.gateway.sessions import user_session_id

    RequestLog = apps.get_model("usage", "RequestLog")
    named = (RequestLog.objects.exclude(session_id="").exclude(session_id__startswith="p-")
             .values_list("session_id", flat=True).distinct())
    for session_id in list(named.iterator()):
        RequestLog.objects.filter(session_id=session_id).update(session_id=user_session_id(session_id))


class Migration(migrations.Migration):

    dependencies = [
        ("usage", "0005_route_rule_and_session"),
    ]

    operations = [
        migrations.RunPython(hash_client_named_ids, migrations.RunPython.noop, elidable=True),
    ]
