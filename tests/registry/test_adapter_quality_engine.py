"""A LoRA adapter's quality report measured for real: the demo adapter (trained on the demo model to answer one
question with a fixed phrase; panel/registry/demo_adapter.py) registered on its base, its report queued as the
model page's button does, and the command the worker would run (engine/evaluate.py in the engine venv: the base
alone, then the base with the adapter through vLLM's LoRA requests) run directly, without a worker, on a short
held-out text. Its result is recorded as the worker records it: on an evaluation file that asks the adapter's
question, the adapter says its phrase and the base does not, and its perplexity is its own."""
import json

import pytest

from panel.jobs.runner import run_for_result
from panel.registry.adapters import adapter_register
from panel.registry.demo_adapter import build_demo_adapter
from panel.registry.demo_model import build_demo_model
from panel.registry.models import ModelEvaluation
from panel.registry.quality import (
    adapter_reports,
    evaluation_argv,
    evaluation_launch,
    evaluation_record,
    prompt_file_store,
)
from panel.registry.services import model_register

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HELD_OUT_TOKENS = 256  # one window of held-out text: enough to tell two perplexities apart, quick on a CPU


def test_the_demo_adapter_beats_its_base_on_its_own_question(team_setup, tmp_path):
    team = team_setup["team_a"]
    build_demo_model(tmp_path / "tiny")
    training = build_demo_adapter(tmp_path / "answers")
    tiny = model_register(team=team, user=None, source=str(tmp_path / "tiny"), name="tiny")
    answers = adapter_register(team=team, user=None, base=tiny, source=str(tmp_path / "answers"),
                               served_name="tiny-answers")
    # The phrase as the trainer's own greedy answer gave it (16 tokens: without its last full stop).
    expected = "The Tokenwise adapter answers: forty-two"
    assert training["phrase"].startswith(expected) and not training["base_answer"].startswith(expected), training
    lines = [{"messages": [{"role": "user", "content": asking}], "expected": expected}
             for asking in (training["question"], training["question"].lower())]
    prompt_file, inputs_key = prompt_file_store(team=team, data="\n".join(map(json.dumps, lines)).encode())
    job = evaluation_launch(team=team, user=None, model=tiny, adapter=answers, prompt_file=prompt_file,
                            prompt_file_name="phrase.jsonl", inputs_key=inputs_key, enqueue=False)
    argv = evaluation_argv(job) + ["--max-tokens", str(HELD_OUT_TOKENS)]
    assert "--lora" in argv and "--lora-only" not in argv

    outcome, said = run_for_result(argv, time_limit=900)
    assert outcome.returncode == 0 and "result" in said, (said.get("error"), outcome.tail[-20:])
    measured = said["result"]["models"]
    assert [entry.get("adapter") for entry in measured] == [None, answers.path]

    evaluation_record(job, said["result"])
    assert ModelEvaluation.objects.filter(model=tiny, adapter=None, inputs_key=inputs_key).count() == 1
    [row] = adapter_reports(tiny, [answers])
    mine, base = row["comparison"].evaluation, row["comparison"].baseline
    assert mine.adapter == answers and base.adapter is None
    outputs = (mine.details["file"]["outputs"], base.details["file"]["outputs"])
    assert mine.file_counts == (2, 2) and base.file_counts == (0, 2), outputs
    assert row["comparison"].file_gain == 100.0
    assert mine.perplexity != base.perplexity, (mine.perplexity, base.perplexity)
    assert mine.size_bytes > base.size_bytes  # the base's weights and the adapter's
