"""The fake cloud provider itself: normal answers through httpx and the official openai SDK, every behaviour,
recording, auth, life cycle, and the process mode the benchmarks use."""
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from tests.support.environment import ROOT
from tests.support.fake_upstream import FakeUpstream, closed_port, content_text, prompt_tokens

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say four words please"}]


@pytest.fixture
def fake():
    with FakeUpstream() as upstream:
        yield upstream


@pytest.fixture
def sdk():
    """Make openai clients for a fake (`sdk(fake, api_key=..., timeout=...)`); they are closed after the test."""
    clients = []

    def make(fake, api_key="sk-test", **options):
        clients.append(openai.OpenAI(base_url=fake.base_url, api_key=api_key, max_retries=0, **options))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def chat(fake, stream=False, **extra):
    """A chat request body for the fake's first model."""
    return {"model": fake.models[0], "messages": MESSAGES, "stream": stream, **extra}


def post_chat(fake, stream=False, timeout=5.0, **extra):
    return httpx.post(f"{fake.base_url}/chat/completions", json=chat(fake, stream, **extra), timeout=timeout)


def stream_chat(client):
    return client.chat.completions.create(model="fake-model", messages=MESSAGES, stream=True,
                                          stream_options={"include_usage": True})


def collect(stream):
    """The chunks a stream yielded and the exception that ended it (None when it ended properly)."""
    chunks = []
    try:
        for chunk in stream:
            chunks.append(chunk)
    except Exception as error:
        return chunks, error
    return chunks, None


def raw_exchange(port, data, read_seconds=2.0):
    """Send raw bytes, return what comes back until the server closes or `read_seconds` pass."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(data)
        sock.settimeout(read_seconds)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (socket.timeout, ConnectionResetError):
            pass
        return received


# --- normal answers -------------------------------------------------------------------------------------------------

def test_it_lists_its_models(sdk):
    with FakeUpstream(models=("m-one", "m-two")) as fake:
        response = httpx.get(f"{fake.base_url}/models")
        assert response.status_code == 200
        assert [model["id"] for model in response.json()["data"]] == ["m-one", "m-two"]
        assert [model.id for model in sdk(fake).models.list()] == ["m-one", "m-two"]


def test_a_chat_completion_carries_the_words_and_usage(sdk):
    with FakeUpstream(cached_tokens=2) as fake:
        completion = sdk(fake).chat.completions.create(model="fake-model", messages=MESSAGES)
        assert completion.choices[0].message.content == content_text(20)
        assert completion.choices[0].finish_reason == "stop"
        usage = completion.usage
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (6, 20, 26)
        assert usage.prompt_tokens_details.cached_tokens == 2
        assert completion.id.startswith("chatcmpl-") and completion.model == "fake-model"
        fake.behave("ok", times=1, cached_tokens=50)
        assert post_chat(fake).json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 6  # at most the prompt


def test_a_stream_sends_one_word_per_chunk_then_usage_when_asked(sdk):
    with FakeUpstream(chunks=5, cached_tokens=1) as fake:
        chunks, error = collect(stream_chat(sdk(fake)))
        assert error is None
        assert chunks[0].choices[0].delta.role == "assistant"
        words = [chunk.choices[0].delta.content for chunk in chunks if chunk.choices and chunk.choices[0].delta.content]
        assert words == ["alpha", " bravo", " charlie", " delta", " echo"]
        assert chunks[-2].choices[0].finish_reason == "stop"
        assert chunks[-1].choices == []
        assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (6, 5)
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 1
        assert fake.requests[0].json["stream_options"] == {"include_usage": True}

        without_usage = sdk(fake).chat.completions.create(model="fake-model", messages=MESSAGES, stream=True)
        chunks, _ = collect(without_usage)
        assert all(chunk.usage is None and chunk.choices for chunk in chunks)


def test_a_stream_ends_with_done_in_chunked_encoding(fake):
    response = post_chat(fake, stream=True)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["transfer-encoding"] == "chunked"
    events = [line for line in response.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]" and len(events) == 1 + 20 + 1 + 1


def test_the_completions_endpoint_streams_and_honours_max_tokens(fake, sdk):
    client = sdk(fake)
    completion = client.completions.create(model="fake-model", prompt="one two three", max_tokens=3)
    assert completion.choices[0].text == content_text(3)
    assert completion.choices[0].finish_reason == "length"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (3, 3)
    chunks, error = collect(client.completions.create(model="fake-model", prompt="hi", stream=True,
                                                      stream_options={"include_usage": True}))
    assert error is None
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == content_text(20)
    assert chunks[-1].usage.completion_tokens == 20


def test_prompt_tokens_count_words_of_messages_or_prompt():
    assert prompt_tokens({"messages": MESSAGES}) == 6
    assert prompt_tokens({"messages": [{"role": "user", "content": [{"type": "text", "text": "a b"}]}]}) == 2
    assert prompt_tokens({"prompt": ["a b", "c"]}) == 3
    assert prompt_tokens({"prompt": [1, 2, 3]}) == 3


# --- checks a real provider makes -----------------------------------------------------------------------------------

def test_auth_requires_the_exact_bearer_key(sdk):
    with FakeUpstream(api_key="sk-right") as fake:
        with pytest.raises(openai.AuthenticationError) as caught:
            sdk(fake, api_key="sk-wrong").chat.completions.create(model="fake-model", messages=MESSAGES)
        assert caught.value.code == "invalid_api_key"
        response = post_chat(fake)
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "invalid_request_error"

        fake.behave("status_500", times=1)
        assert post_chat(fake).status_code == 401  # a rejected request consumes no behaviour
        assert sdk(fake, api_key="sk-right").with_raw_response.models.list().status_code == 200
        with pytest.raises(openai.InternalServerError):
            sdk(fake, api_key="sk-right").chat.completions.create(model="fake-model", messages=MESSAGES)
        assert fake.requests[-1].headers["authorization"] == "Bearer sk-right"
        assert [request.behaviour for request in fake.requests] == [None, None, None, "ok", "status_500"]


def test_an_unknown_model_is_a_404(fake, sdk):
    with pytest.raises(openai.NotFoundError) as caught:
        sdk(fake).chat.completions.create(model="nope", messages=MESSAGES)
    assert caught.value.code == "model_not_found"


def test_bad_requests_are_rejected_like_a_provider_would(fake):
    url = f"{fake.base_url}/chat/completions"
    assert httpx.post(url, content=b"{not json").status_code == 400
    assert httpx.post(url, json=chat(fake, stream_options={"include_usage": True})).status_code == 400
    assert httpx.post(f"{fake.base_url}/embeddings", json={}).status_code == 404
    assert httpx.get(url).status_code == 405
    answer = raw_exchange(fake.port, b"NONSENSE\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ") and b"connection: close" in answer


# --- behaviours -----------------------------------------------------------------------------------------------------

def test_status_behaviours_are_consumed_in_order_then_back_to_normal(fake, sdk):
    fake.behave("status_503", times=2).behave("status_500", times=1)
    assert fake.queued == ["status_503", "status_503", "status_500"]
    assert [post_chat(fake).status_code for _ in range(4)] == [503, 503, 500, 200]
    assert [request.behaviour for request in fake.requests] == ["status_503", "status_503", "status_500", "ok"]
    fake.behave("status_503")
    with pytest.raises(openai.InternalServerError):
        sdk(fake).chat.completions.create(model="fake-model", messages=MESSAGES)
    assert post_chat(fake).status_code == 503  # a default stays until changed
    fake.behave("ok")
    assert post_chat(fake).status_code == 200


def test_429_sends_retry_after(fake, sdk):
    fake.behave("status_429", times=1).behave("status_429", times=1, retry_after=7)
    fake.behave("status_429", times=1, retry_after=None)
    with pytest.raises(openai.RateLimitError) as caught:
        sdk(fake).chat.completions.create(model="fake-model", messages=MESSAGES)
    assert caught.value.response.headers["retry-after"] == "1"
    assert caught.value.code == "rate_limit_exceeded"
    assert post_chat(fake).headers["retry-after"] == "7"
    assert "retry-after" not in post_chat(fake).headers


def test_behaviours_target_the_inference_paths_unless_told(fake):
    fake.behave("status_503", times=1)
    assert httpx.get(f"{fake.base_url}/models").status_code == 200
    fake.behave("status_500", times=1, path="/v1/models")
    assert httpx.get(f"{fake.base_url}/models").status_code == 500
    assert post_chat(fake).status_code == 503
    assert fake.queued == []


def test_hang_before_headers_trips_the_client_timeout_and_the_fake_sees_it_leave(fake):
    fake.behave("hang_before_headers", times=1)
    with pytest.raises(httpx.ReadTimeout):
        post_chat(fake, timeout=0.3)
    fake.wait_for_disconnects(1)
    assert fake.requests[0].disconnected and fake.requests[0].behaviour == "hang_before_headers"
    assert post_chat(fake).status_code == 200


def test_hang_before_headers_with_a_delay_answers_late(fake):
    fake.behave("hang_before_headers", times=1, delay=0.3)
    started = time.monotonic()
    assert post_chat(fake).status_code == 200
    assert time.monotonic() - started >= 0.3


def test_hang_after_headers_sends_headers_then_nothing(fake, sdk):
    fake.behave("hang_after_headers", times=2)
    with httpx.stream("POST", f"{fake.base_url}/chat/completions", json=chat(fake, stream=True),
                      timeout=0.3) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        with pytest.raises(httpx.ReadTimeout):
            response.read()
    stream = stream_chat(sdk(fake, timeout=0.3))  # returns once the headers are in
    assert stream.response.status_code == 200
    chunks, error = collect(stream)
    assert chunks == [] and isinstance(error, openai.APITimeoutError)
    fake.wait_for_disconnects(2)


def test_cut_stream_stops_mid_way_and_the_client_raises(fake, sdk):
    fake.behave("cut_stream", times=1).behave("cut_stream", times=1, after=5).behave("cut_stream", times=1)
    chunks, error = collect(stream_chat(sdk(fake)))
    assert len(chunks) == 3 and isinstance(error, openai.APIConnectionError)
    with httpx.stream("POST", f"{fake.base_url}/chat/completions", json=chat(fake, stream=True)) as response:
        lines = []
        with pytest.raises(httpx.RemoteProtocolError):
            for line in response.iter_lines():
                lines.append(line)
    assert len([line for line in lines if line.startswith("data: ")]) == 5
    assert "data: [DONE]" not in lines
    with pytest.raises(httpx.RemoteProtocolError):
        post_chat(fake)  # a non-streaming answer is cut half-way through its body
    assert fake.disconnects == 0  # the fake closed, not the client


def test_error_event_arrives_in_a_200_stream(fake, sdk):
    fake.behave("error_event", times=1).behave("error_event", times=1, after=2, message="boom")
    chunks, error = collect(stream_chat(sdk(fake)))
    assert chunks == [] and isinstance(error, openai.APIError)
    assert error.message == "The server had an error while processing your request."
    response = post_chat(fake, stream=True)
    assert response.status_code == 200
    events = [line for line in response.text.split("\n\n") if line]
    assert json.loads(events[2].removeprefix("data: ")) == {
        "error": {"message": "boom", "type": "server_error", "param": None, "code": None}}
    assert events[3:] == ["data: [DONE]"]


def test_malformed_json_in_a_body_and_in_a_stream(fake, sdk):
    fake.behave("malformed_json", times=2)
    response = post_chat(fake)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    with pytest.raises(ValueError):
        response.json()
    chunks, error = collect(stream_chat(sdk(fake)))
    assert chunks == [] and isinstance(error, json.JSONDecodeError)
    fake.behave("malformed_json", times=1, after=1)
    assert post_chat(fake, stream=True).text.split("\n\n")[1] == "data: {not json"


def test_slow_drip_spaces_the_chunks_out(fake, sdk):
    fake.behave("slow_drip", times=2, delay=0.1, chunks=3)
    arrivals = []
    asked = time.monotonic()
    for _ in stream_chat(sdk(fake)):
        arrivals.append(time.monotonic())
    assert len(arrivals) == 6  # role, 3 words, finish, usage
    # A busy client may read two frames in one go, so the gaps it sees can shrink; but no frame can come before the
    # server sent it, five delays after the first.
    assert arrivals[-1] - asked >= 5 * 0.1
    started = time.monotonic()
    assert post_chat(fake).json()["choices"][0]["message"]["content"] == content_text(3)
    assert time.monotonic() - started >= 0.18  # the body came in 3 drips


def test_chunk_delay_paces_streams_and_non_streaming_answers(sdk):
    with FakeUpstream(chunks=3, chunk_delay=0.05) as fake:
        started = time.monotonic()
        assert post_chat(fake).status_code == 200
        assert time.monotonic() - started >= 0.15
        started = time.monotonic()
        collect(stream_chat(sdk(fake)))
        assert time.monotonic() - started >= 0.25  # role, 3 words, finish, usage, [DONE]: 6 gaps


def test_a_connection_stays_usable_after_an_answer_that_waited(fake):
    fake.behave("slow_drip", times=1, delay=0.01).behave("hang_before_headers", times=1, delay=0.05)
    fake.behave("hang_after_headers", times=1, delay=0.05)
    with httpx.Client(base_url=fake.base_url) as http:
        for stream in (True, False, True, False):
            assert http.post("/chat/completions", json=chat(fake, stream)).status_code == 200
    assert fake.total_connections == 1 and fake.queued == []


def test_json_content_parses_and_broken_json_content_does_not(fake, sdk):
    fake.behave("json_content", times=1).behave("json_content", times=1, value={"x": [1, 2]})
    fake.behave("broken_json_content", times=1)
    client = sdk(fake)
    answers = [client.chat.completions.create(model="fake-model", messages=MESSAGES) for _ in range(3)]
    assert json.loads(answers[0].choices[0].message.content) == {"answer": content_text(20)}
    assert json.loads(answers[1].choices[0].message.content) == {"x": [1, 2]}
    with pytest.raises(ValueError):
        json.loads(answers[2].choices[0].message.content)
    assert all(answer.choices[0].finish_reason == "stop" and answer.usage.total_tokens for answer in answers)
    fake.behave("json_content", times=1)
    chunks, _ = collect(stream_chat(sdk(fake)))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert json.loads(text) == {"answer": content_text(20)} and len(chunks) > 3


def test_a_client_leaving_mid_stream_is_recorded(sdk):
    with FakeUpstream(chunks=100, chunk_delay=0.02) as fake:
        stream = stream_chat(sdk(fake))
        for _, _chunk in zip(range(3), stream):
            pass
        stream.close()
        fake.wait_for_disconnects(1)
        assert fake.requests[0].disconnected
        deadline = time.monotonic() + 2
        while fake.open_connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fake.open_connections == 0


def test_refused_connections(fake):
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{closed_port()}/v1/models")
    with openai.OpenAI(base_url=f"http://127.0.0.1:{closed_port()}/v1", api_key="k", max_retries=0) as client:
        with pytest.raises(openai.APIConnectionError):
            client.models.list()
    fake.behave("refuse", times=1)
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        post_chat(fake)
    assert post_chat(fake).status_code == 200
    assert [request.behaviour for request in fake.requests] == ["refuse", "ok"]


def test_behave_checks_names_and_options(fake):
    with pytest.raises(ValueError):
        fake.behave("explode")
    with pytest.raises(ValueError):
        fake.behave("status_200")
    with pytest.raises(TypeError):
        fake.behave("cut_stream", delay=1)
    with pytest.raises(ValueError):
        fake.behave("ok", times=-1)
    assert fake.queued == []


# --- recording and life cycle ---------------------------------------------------------------------------------------

def test_requests_are_recorded_from_many_clients_at_once(fake):
    def client():
        with httpx.Client(base_url=fake.base_url) as http:
            for _ in range(5):
                assert http.post("/chat/completions", json=chat(fake, stream=True)).status_code == 200

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    requests = fake.wait_for_requests(40)
    assert len(requests) == fake.request_count == 40
    assert fake.total_connections == 8  # each client kept its connection alive
    assert all(request.method == "POST" and request.json["messages"] == MESSAGES for request in requests)
    fake.reset()
    assert (fake.requests, fake.request_count, fake.disconnects) == ([], 0, 0)


def test_without_recording_requests_are_only_counted():
    with FakeUpstream(record=False) as fake:
        assert post_chat(fake).status_code == 200
        assert (fake.requests, fake.request_count) == ([], 1)


def test_chunked_request_bodies_and_expect_continue_are_read(fake):
    payload = json.dumps(chat(fake)).encode()
    response = httpx.post(f"{fake.base_url}/chat/completions", content=iter([payload[:10], payload[10:]]))
    assert response.status_code == 200
    assert fake.requests[0].headers["transfer-encoding"] == "chunked" and fake.requests[0].json == chat(fake)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\nconnection: close\r\n"
            f"content-length: {len(payload)}\r\n\r\n").encode()
    answer = raw_exchange(fake.port, head + payload)
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")


def test_pipelined_requests_are_answered_in_order(fake):
    request = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"
    closing = b"GET /v1/nowhere HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    answer = raw_exchange(fake.port, request + request + closing)
    assert answer.count(b"HTTP/1.1 200 OK") == 2 and answer.index(b"HTTP/1.1 404 ") > answer.rindex(b"200 OK")
    assert fake.total_connections == 1 and fake.request_count == 3


def test_it_starts_fast_stops_every_connection_and_restarts_on_its_port():
    started = time.monotonic()
    fake = FakeUpstream().start()
    assert time.monotonic() - started < 0.2
    idle = socket.create_connection(("127.0.0.1", fake.port))
    idle.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
    assert idle.recv(65536).startswith(b"HTTP/1.1 200 OK")
    fake.behave("hang_before_headers", times=1)
    hanging = socket.create_connection(("127.0.0.1", fake.port))
    body = json.dumps(chat(fake)).encode()
    hanging.sendall(b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    fake.wait_for_requests(2)
    assert fake.open_connections == 2

    started = time.monotonic()
    fake.stop()
    assert time.monotonic() - started < 1
    for sock in (idle, hanging):
        sock.settimeout(2)
        assert sock.recv(65536) == b""
        sock.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{fake.base_url}/models")

    with fake:
        assert httpx.get(f"{fake.base_url}/models").status_code == 200


def test_it_runs_as_a_process():
    command = [sys.executable, "-m", "tests.support.fake_upstream", "--port", "0", "--chunks", "3"]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True) as process:
        try:
            line = process.stdout.readline()
            assert line.startswith("fake upstream listening on http://127.0.0.1:")
            base_url = line.split()[-1]
            response = httpx.post(f"{base_url}/chat/completions", json={"model": "fake-model", "messages": MESSAGES})
            assert response.json()["choices"][0]["message"]["content"] == content_text(3)
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=5) == 0
