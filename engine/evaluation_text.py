"""The quality report's built-in inputs (standard library only; runs inside the engine venv).

- Held-out text: the sources of stdlib modules that neither the demo model's training corpus
  (engine/build_demo_model.py CORPUS_MODULES) nor the builtin calibration corpus (engine/awq_calibration.py)
  uses, so a perplexity measured on it is on text the model and the quantizer never saw.
- Prompts for greedy agreement: short prose and code openings.
- JSON turns: a user asks for a record as a JSON object, naming its keys and values; the demo model is trained on
  the "train" split and measured on the "eval" split (other names, other numbers) of engine/quality_tasks.py."""
import sysconfig
from pathlib import Path

HELD_OUT_MODULES = ("bdb", "filecmp", "netrc", "zipapp")

TRAIN_NAMES = ("apple", "river", "copper", "falcon", "meadow", "harbor", "lantern", "pepper", "quartz", "saddle",
               "timber", "violet", "walnut", "canyon", "ember", "glacier")
EVAL_NAMES = ("anchor", "bramble", "cobalt", "dune", "fern", "granite", "hazel", "iris", "juniper", "kettle",
              "lotus", "maple")

AGREEMENT_PROMPTS = (
    "def read_config(path):\n    \"\"\"Return the settings stored in",
    "The function returns a list of",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "Raise ValueError if the",
    "class Parser:\n    def __init__(self, text):\n        self.",
    "    for line in lines:\n        if not line",
    "This module provides a simple interface to",
    "    try:\n        value = int(",
    "Return True if the file",
    "        raise TypeError(\"expected a",
    "# Copyright and license notes are kept in",
    "    def close(self):\n        \"\"\"Close the",
)


def held_out_texts():
    """The held-out sources, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / f"{name}.py").read_text(encoding="utf-8") for name in HELD_OUT_MODULES
            if (stdlib / f"{name}.py").is_file()]


def held_out_ids(tokenizer, max_tokens):
    """The first `max_tokens` token ids of the held-out text, as `tokenizer` reads it."""
    ids = []
    for text in held_out_texts():
        ids.extend(tokenizer.encode(text, add_special_tokens=False))
        if len(ids) >= max_tokens:
            break
    return ids[:max_tokens]


def json_record(index, split):
    names = TRAIN_NAMES if split == "train" else EVAL_NAMES
    name = names[index % len(names)]
    number = (index * 37 + (11 if split == "train" else 503)) % 997
    active = "true" if (index // len(names)) % 2 == 0 else "false"
    return name, number, active


def json_turn(index, *, split):
    """A chat turn (user, assistant) whose answer is a JSON object; the question names every key and value, as a
    user of a real model would (the demo model learns this form from the "train" split)."""
    name, number, active = json_record(index, split)
    answer = f'{{"name": "{name}", "id": {number}, "active": {active}}}'
    question = (f'Reply with only a JSON object with the keys "name", "id" and "active": name "{name}", id {number}, '
                f"active {active}.")
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
