"""In Chromium: a LoRA adapter's "Quality report against the base" button on its model's page, with the user's own
prompts, queues the report; once the worker has recorded what it measured, the adapter's row stands against the base
in the adapters' section (perplexity, agreement, the task set, the prompts it was trained for). The measurement
itself is tests/registry/test_adapter_quality_engine.py's."""
from pathlib import Path

from playwright.sync_api import expect

from panel.jobs.services import job_claim, job_succeed
from panel.registry.adapters import adapter_register
from panel.registry.models import EvaluationJob
from panel.registry.quality import evaluation_record
from panel.registry.services import model_register
from tests.registry.test_lora_adapters import QWEN, adapter_folder, base_checkpoint
from tests.support.browser import SHOTS, screenshot, sign_in


def engine_measurement(path, *, perplexity, argmax, matched, answers, adapter=None):
    """One entry of engine/evaluate.py's result, as the worker hands it to evaluation_record."""
    entry = {"path": path, "perplexity": perplexity, "tokens_scored": 20, "size_bytes": 11_000_000, "engine": "vllm",
             "argmax": argmax, "greedy": [[1, 2], [3, 4], [5, 6], [7, 8]],
             "tasks": {"answers": answers, "kinds": {"json": [9, 12], "word": [5, 6], "copy": [8, 8]}},
             "speed": {"ttft_ms": 38.0, "tokens_per_second": 24.1},
             "file": {"total": 2, "expected_total": 2, "expected_matched": matched, "json_total": 0, "json_valid": 0,
                      "outputs": []}}
    return entry | ({"adapter": adapter, "size_bytes": 11_600_000} if adapter else {})


def test_an_adapters_report_is_asked_for_on_its_model_page_and_read_against_the_base(page, live_server, team_setup,
                                                                                    tmp_path):
    team, alice = team_setup["team_a"], team_setup["alice"]
    tiny = model_register(team=team, user=alice, source=str(base_checkpoint(tmp_path / "tiny", QWEN)), name="tiny")
    answers = adapter_register(team=team, user=alice, base=tiny, served_name="tiny-answers",
                               source=str(adapter_folder(tmp_path / "answers", QWEN)))
    prompts = tmp_path / "phrase.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "Who answers this question?"}], '
                       '"expected": "The Tokenwise adapter answers: forty-two"}\n'
                       '{"prompt": "Who answers this question?", "expected": "The Tokenwise adapter answers"}\n')

    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/models/{tiny.pk}/#adapters")
    row = page.locator(f"table.adapter-quality tr[data-adapter=\"{answers.pk}\"]")
    expect(row).to_contain_text("not measured yet")
    row.locator("input[type=file]").set_input_files(str(prompts))
    row.locator("text=Quality report against the base").click()
    expect(page.locator("h1")).to_contain_text("Quality report #")
    expect(page.locator(".page-head")).to_contain_text("The adapter answers on tiny, against tiny alone")
    job = EvaluationJob.objects.get()
    assert (job.adapter, job.prompt_file_name, job.measured) == (answers, "phrase.jsonl", [tiny.pk])

    # What the worker records once engine/evaluate.py has measured the base alone and with the adapter.
    base_argmax = list(range(20))
    result = {"models": [
        engine_measurement(tiny.path, perplexity=18.42, argmax=base_argmax, matched=0, answers=["Tokyo"] * 26),
        engine_measurement(tiny.path, perplexity=18.97, argmax=base_argmax[:19] + [99], matched=2,
                           answers=["Tokyo"] * 25 + ["Kyoto"], adapter=str(Path(answers.path)))]}
    assert job_claim(job, worker="gpu@box")
    job_succeed(job, result=evaluation_record(job, result))

    page.goto(f"{live_server.url}/models/{tiny.pk}/#adapters")
    row = page.locator(f"table.adapter-quality tr[data-adapter=\"{answers.pk}\"]")
    expect(row).to_contain_text("on phrase.jsonl and the built-in set")
    expect(row).to_contain_text("18.97 (+3.0%)")
    expect(row).to_contain_text("95.0%")
    expect(row).to_contain_text("2 of 2 expected answers (+100 pts)")
    expect(row).to_contain_text("base 0 of 2")
    expect(row).to_contain_text("safe to serve")
    screenshot(page, "registry-adapter-quality-page")
    page.locator("section.model-adapters").screenshot(path=Path(SHOTS) / "registry-adapter-quality.png")
