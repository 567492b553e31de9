"""Oversized requests to the panel: a form body over DATA_UPLOAD_MAX_MEMORY_SIZE and an upload over
MAX_UPLOAD_BYTES are refused with 413 and the limit in words, and nothing is written."""
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings
from django.urls import reverse

from panel.channels.models import Channel, Route


def test_it_refuses_a_form_body_over_the_limit(client, team_setup):
    client.force_login(team_setup["alice"])
    response = client.post(reverse("channel_create"), {"name": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1),
                                                       "base_url": "http://127.0.0.1:9/v1"})
    assert response.status_code == 413
    assert "The form is larger than 2.5 MB. Nothing was saved." in response.content.decode()
    assert Channel.objects.count() == 0


@override_settings(MAX_UPLOAD_BYTES=64 * 1024)
def test_it_refuses_an_upload_over_the_limit_before_reading_it(client, team_setup):
    client.force_login(team_setup["alice"])
    big = SimpleUploadedFile("settings.json", b'{"channels": {}}' + b" " * (64 * 1024), "application/json")
    response = client.post(reverse("settings_import"), {"file": big})
    assert response.status_code == 413
    assert "The upload is larger than 0.0625 MB. Nothing was saved." in response.content.decode()
    assert Channel.objects.count() == 0 and Route.objects.count() == 0
    small = SimpleUploadedFile("settings.json", b"{not json", "application/json")
    refused = client.post(reverse("settings_import"), {"file": small})  # under the limit: the importer decides
    assert refused.status_code == 400 and Channel.objects.count() == 0


def test_it_leaves_other_bad_requests_to_django(client, team_setup):
    from django.core.exceptions import SuspiciousOperation
    from django.test import RequestFactory

    from panel.core.request_size import bad_request

    response = bad_request(RequestFactory().get("/"), SuspiciousOperation("odd"))
    assert response.status_code == 400 and b"Bad Request" in response.content


def test_the_server_refuses_a_body_over_every_limit_before_django_reads_it(transactional_db):
    """Django's ASGI handler spools a whole body to disk before any check: the server's front (panel/asgi.py)
    refuses one larger than anything a page takes on its Content-Length, without waiting for it, and a chunked
    one as soon as it passes the limit."""
    import socket

    import httpx
    from django.db import connection

    from tests.support.gateway_server import GatewayServer

    server = GatewayServer(connection.settings_dict["NAME"], TOKENWISE_MAX_UPLOAD_BYTES="65536",
                           TOKENWISE_MAX_FORM_BYTES="32768")
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:  # 10 GB promised, none sent
            raw.sendall(b"POST /settings/import/ HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
                        b"boundary=b\r\nContent-Length: 10737418240\r\n\r\n")
            answer = b""
            while b"</html>" not in answer:
                chunk = raw.recv(65536)
                if not chunk:
                    break
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 413 ")
        assert b"The request is larger than 0.0625 MB. Nothing was saved." in answer

        def chunks():
            for _ in range(100):
                yield b"x" * 4096

        chunked = httpx.post(f"{server.url}/login/", content=chunks(), timeout=10)
        assert chunked.status_code == 413 and "larger than 0.0625 MB" in chunked.text
        small = httpx.post(f"{server.url}/login/", data={"username": "nobody", "password": "x"}, timeout=10)
        assert small.status_code == 403  # under the limit: Django decides (here: no CSRF token)
    finally:
        server.stop()
