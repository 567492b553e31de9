"""The quality report's built-in task set: chat turns with answers a program can check (standard library only; runs
inside the engine venv, and the panel reads the kinds).

Every prompt says what it wants, the way a user of a real model would ask: JSON tasks name the keys and the values
(an answer counts with the keys and the types of values asked for, what a program parsing it relies on), the others
ask for one word, a copy or one of two labels. A real chat model of 135 M parameters answers most of them; the demo
model is trained on the JSON tasks' form (other names, other numbers) and answers those. A model's score is the
share it gets right; the report also counts the answers a child gives exactly as its parent did."""
import json
import re

from engine import evaluation_text

ANSWER_TOKENS = 64  # room for a JSON object in a code fence, or a one-word answer and a sentence around it
JSON_TASKS = 12

# Chosen so that a real chat model of 135 M parameters (SmolLM2-135M-Instruct) answers nearly all of them: a kind its
# parent fails throughout cannot show what quantization costs (measured: docs/benchmarks.md).
WORD_TASKS = (
    ("What is the capital of Japan? Answer with one word.", ("tokyo",)),
    ("What is the capital of France? Answer with one word.", ("paris",)),
    ("What is the capital of Italy? Answer with one word.", ("rome",)),
    ("What is the capital of Germany? Answer with one word.", ("berlin",)),
    ("What is the opposite of hot? Answer with one word.", ("cold",)),
    ("What is the opposite of up? Answer with one word.", ("down",)),
    ("What is the plural of mouse? Answer with one word.", ("mice",)),
    ("How many days are there in a week? Answer with one number.", ("7", "seven")),
    ("What colour is the sky on a clear day? Answer with one word.", ("blue",)),
    ("What is 2 plus 3? Answer with one number.", ("5", "five")),
)
COPY_TASKS = ("the quick brown fox", "a cup of tea", "good morning", "the cat sat on the mat")
CLASSIFY_TASKS = (
    ("Is an apple a fruit or a vegetable? Answer with one word.", ("fruit", "vegetable"), "fruit"),
    ("Is snow hot or cold? Answer with one word.", ("hot", "cold"), "cold"),
    ("Is Mars a star or a planet? Answer with one word.", ("star", "planet"), "planet"),
    ("Is the sun a star or a planet? Answer with one word.", ("star", "planet"), "star"),
)
KINDS = ("json", "word", "copy", "classify")


def tasks():
    """[{"kind", "messages", "expected"}]: the task set, in a fixed order (JSON first)."""
    items = []
    for index in range(JSON_TASKS):
        user, assistant = evaluation_text.json_turn(index, split="eval")
        items.append({"kind": "json", "messages": [user], "expected": json.loads(assistant["content"])})
    for question, words in WORD_TASKS:
        items.append({"kind": "word", "messages": [{"role": "user", "content": question}], "expected": words})
    for text in COPY_TASKS:
        prompt = f'Repeat after me: "{text}"'
        items.append({"kind": "copy", "messages": [{"role": "user", "content": prompt}], "expected": text})
    for question, labels, label in CLASSIFY_TASKS:
        items.append({"kind": "classify", "messages": [{"role": "user", "content": question}], "expected": label,
                      "labels": labels})
    return items


def json_object_in(text):
    """The JSON object an answer holds (in a code fence or around a sentence too), or None."""
    text = re.sub(r"```(?:json)?", "", text)
    start = text.find("{")
    while start != -1:
        try:
            value, _ = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        return value if isinstance(value, dict) else None
    return None


def words_of(text):
    return re.findall(r"[a-z0-9]+", text.lower())


def shape(value):
    """A JSON object's keys with the type of each value: what a program that parses the answer relies on."""
    return {key: type(item).__name__ for key, item in value.items()}


def is_right(task, answer):
    """Whether `answer` (text) answers `task` as asked: a JSON object with exactly the keys asked for, each value of
    the type asked for (a text, a number, true or false; the object may sit in a code fence or a sentence); the word
    among the first twelve; the text copied word for word within the answer; the label of the two named that the
    answer names first."""
    kind, expected, words = task["kind"], task["expected"], words_of(answer)
    if kind == "json":
        found = json_object_in(answer)
        return found is not None and shape(found) == shape(expected)
    if kind == "word":
        return any(word in expected for word in words[:12])
    if kind == "copy":
        wanted = words_of(expected)
        return any(words[start:start + len(wanted)] == wanted for start in range(len(words)))
    named = [word for word in words if word in task["labels"]]
    return bool(named) and named[0] == expected


def score(items, answers):
    """{"answers", "right", "kinds": {kind: [right, total]}} of `answers` (texts) to `items` (tasks())."""
    right = [is_right(task, answer) for task, answer in zip(items, answers)]
    kinds = {kind: [0, 0] for kind in KINDS}
    for task, ok in zip(items, right):
        kinds[task["kind"]][0] += ok
        kinds[task["kind"]][1] += 1
    return {"answers": [answer[:300] for answer in answers], "right": right, "kinds": kinds}
