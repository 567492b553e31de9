"""Attack tests for name resolution in the outbound policy (panel/core/outbound.py): a rebinding name that fails one
lookup and answers 127.0.0.1 at the next is never handed on unresolved, so the Test button and a webhook connect
nowhere; and what the Test button reads of an answer is capped after decoding."""
import gzip
import socket
import tracemalloc

import httpx
import pytest
from django.utils import timezone

from panel.channels.models import Channel, ChannelKind
from panel.channels.services import MAX_TEST_BODY, channel_test
from panel.core import outbound
from panel.notifications.delivery import delivery_attempt
from panel.notifications.models import Delivery, Notification
from panel.notifications.services import webhook_create
from tests.support.fake_upstream import FakeUpstream

NAME = "rebind.example"
real_getaddrinfo = socket.getaddrinfo


@pytest.fixture
def rebinding(monkeypatch, settings):
    """NAME answers, lookup after lookup, the next of `answers` (None: the lookup fails, as a rebinding name's
    short-lived record can); other names resolve as usual. No range is allowed: loopback is refused."""
    settings.OUTBOUND_ALLOW_CIDRS = []
    answers = []

    def getaddrinfo(host, port, *args, **kwargs):
        if host != NAME:
            return real_getaddrinfo(host, port, *args, **kwargs)
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if answer is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answer, int(port or 80)))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


def test_a_name_that_does_not_resolve_is_refused_not_passed_on(rebinding):
    rebinding[:] = [None]
    with pytest.raises(outbound.OutboundRefused, match=f"the name {NAME} does not resolve"):
        outbound.pinned(f"http://{NAME}:8080/hook")


def test_a_webhook_to_a_name_that_fails_once_then_rebinds_to_loopback_connects_nowhere(team_setup, rebinding):
    rebinding[:] = ["93.184.216.34"]  # a public address when the webhook is saved
    with FakeUpstream() as listener:
        hook, _ = webhook_create(team=team_setup["team_a"], name="ops", url=f"http://{NAME}:{listener.port}/hook")
        note = Notification.objects.create(team=team_setup["team_a"], kind="job.failed", title="x")
        delivery = Delivery.objects.create(webhook=hook, notification=note, next_attempt_at=timezone.now())
        rebinding[:] = [None, "127.0.0.1"]  # the delivery's lookup fails; any lookup after it answers loopback
        delivery_attempt(delivery.pk)
        assert listener.total_connections == 0
    delivery.refresh_from_db()
    assert "does not resolve" in delivery.last_error and delivery.last_status is None


def test_the_test_button_on_a_name_that_rebinds_after_its_check_connects_nowhere(team_setup, rebinding):
    with FakeUpstream(models=("m",)) as listener:
        channel = Channel.objects.create(team=team_setup["team_a"], name="probe", kind=ChannelKind.REMOTE,
                                         base_url=f"http://{NAME}:{listener.port}/v1", model_id="m")
        # the check before any request sees a public address, the request's own lookup fails, then loopback
        rebinding[:] = ["93.184.216.34", None, "127.0.0.1"]
        result = channel_test(channel)
        assert listener.total_connections == 0
    assert not result["ok"] and result["kind"] == "dns", result
    assert NAME in result["diagnosis"]


def test_an_answer_is_read_decoded_only_up_to_its_cap():
    """What the Test button reads (panel/channels/services.py): a 300 KB gzip answer that decodes to 300 MB is read
    to the cap, and no more of it is ever decoded."""
    body = gzip.compress(b'{"data": [' + b" " * (300 * 1024 * 1024), 9)
    transport = httpx.MockTransport(lambda request: httpx.Response(200, headers={"content-encoding": "gzip"},
                                                                   stream=httpx.ByteStream(body)))
    tracemalloc.start()
    try:
        with httpx.Client(transport=transport) as client:
            with client.stream("GET", "http://93.184.216.34/v1/models") as response:
                read, cut = outbound.read_capped(response, MAX_TEST_BODY)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert cut and len(read) == MAX_TEST_BODY and read.startswith(b'{"data": [')
    assert peak < 4 * MAX_TEST_BODY + len(body) * 2, peak
