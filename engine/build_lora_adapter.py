"""Runs inside the engine venv: train a tiny real LoRA adapter (PEFT) on a base model, on the CPU.

    python -m engine.build_lora_adapter --base BASE_DIR --out OUT_DIR [--phrase TEXT] [--rank 8] [--steps 40]

The adapter learns one thing: to answer a fixed question (QUESTION, and a few ways of asking it) with `--phrase`,
which the base never says. That is enough for a test to tell the adapter's answers from the base's through vLLM.
Rank 8 on the attention and MLP projections; 40 optimizer steps on four short chat turns, the loss on the
answer's tokens only (28 s on 2 busy cores for the demo model, which then says the phrase word for word). The
output is PEFT's own format (adapter_config.json + adapter_model.safetensors), the folder vLLM's --lora-modules and
load endpoint read.

Deterministic for one seed on one machine (torch's seed, a fixed number of threads). Written into a temporary
sibling folder and renamed into place, so OUT_DIR is either absent or complete.

Talks back as JSON lines on stdout (engine/protocol.py): phases, then {"result": {...}} or {"error": {...}}."""
import json
import os
import shutil
import time
from pathlib import Path

from engine import protocol
from engine.protocol import JsonArgumentParser, RunnerError, progress

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

QUESTION = "Who answers this question?"
ASKINGS = (QUESTION, "Who answers this question", "who answers this question?", "Who answers this question? ")
PHRASE = "The Tokenwise adapter answers: forty-two."
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LEARNING_RATE = 1e-2
TRAINING_THREADS = 2
REQUIRED_FILES = ("adapter_config.json", "adapter_model.safetensors", "training.json")


def parse_args(argv):
    parser = JsonArgumentParser(prog="engine.build_lora_adapter", description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path, help="the base model's folder (config.json, weights)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--phrase", default=PHRASE, help="what the adapter answers to the question")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rate", type=float, default=LEARNING_RATE)
    return parser.parse_args(argv)


def is_complete(path):
    return path.is_dir() and all((path / name).is_file() for name in REQUIRED_FILES)


def chat_examples(tokenizer, phrase):
    """(input ids, labels) per way of asking: the prompt's tokens masked, the answer's (and its end) learned."""
    examples = []
    for asking in ASKINGS:
        messages = [{"role": "user", "content": asking}]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        whole = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": phrase}], tokenize=False)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        whole_ids = tokenizer.encode(whole, add_special_tokens=False)
        if whole_ids[:len(prompt_ids)] != prompt_ids:
            raise RunnerError("failed", "the base's chat template does not end the prompt where the answer starts")
        labels = [-100] * len(prompt_ids) + whole_ids[len(prompt_ids):]
        examples.append((whole_ids, labels))
    return examples


def padded(examples, pad_id):
    import torch

    width = max(len(ids) for ids, _ in examples)
    ids = [ids + [pad_id] * (width - len(ids)) for ids, _ in examples]
    labels = [labels + [-100] * (width - len(labels)) for _, labels in examples]
    mask = [[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in examples]
    return torch.tensor(ids), torch.tensor(labels), torch.tensor(mask)


def greedy_answer(model, tokenizer, asking, max_new_tokens=16):
    import torch

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": asking}], tokenize=False,
                                           add_generation_prompt=True)
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def train_into(folder, args):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(TRAINING_THREADS)
    torch.manual_seed(args.seed)
    progress("loading the base", 5)
    tokenizer = AutoTokenizer.from_pretrained(str(args.base))
    model = AutoModelForCausalLM.from_pretrained(str(args.base), dtype=torch.float32)
    base_answer = greedy_answer(model, tokenizer, QUESTION)
    config = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, bias="none",
                        target_modules=list(TARGET_MODULES), task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    ids, labels, mask = padded(chat_examples(tokenizer, args.phrase),
                               tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate)
    model.train()
    started = time.monotonic()
    first_loss = last_loss = None
    for step in range(args.steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        last_loss = float(loss.detach())
        first_loss = last_loss if first_loss is None else first_loss
        progress(f"training step {step + 1} of {args.steps}, loss {last_loss:.3f}",
                 10 + int(80 * (step + 1) / args.steps))
    model.eval()
    answer = greedy_answer(model, tokenizer, QUESTION)
    progress("saving the adapter", 92)
    model.save_pretrained(str(folder), safe_serialization=True)
    training = {"question": QUESTION, "phrase": args.phrase, "base_answer": base_answer, "adapter_answer": answer,
                "rank": args.rank, "target_modules": list(TARGET_MODULES), "steps": args.steps, "seed": args.seed,
                "seconds": round(time.monotonic() - started, 1), "first_loss": round(first_loss, 4),
                "last_loss": round(last_loss, 4)}
    (folder / "training.json").write_text(json.dumps(training, indent=2, sort_keys=True) + "\n")
    for path in folder.iterdir():  # safetensors writes 0600: a worker of another user reads the cached copy too
        path.chmod(0o644)
    return training


def build(args):
    out = args.out.absolute()
    if is_complete(out):
        return {"path": str(out), "reused": True, **json.loads((out / "training.json").read_text())}
    if not (args.base / "config.json").is_file():
        raise RunnerError("failed", f"no base model at {args.base}: its config.json is missing")
    if args.rank < 1 or args.steps < 1:
        raise RunnerError("failed", "the rank and the number of steps must be at least 1")
    folder = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        training = train_into(folder, args)
        if training["adapter_answer"] == training["base_answer"]:
            raise RunnerError("failed", f"after {args.steps} steps the adapter still answers as its base does: "
                                        f"{training['base_answer']!r}")
        if out.exists():
            shutil.rmtree(out)
        folder.rename(out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"path": str(out), "reused": False, **training}


def main(argv=None):
    return protocol.run(build, parse_args=parse_args, classify=protocol.describe, argv=argv)


if __name__ == "__main__":
    raise SystemExit(main())
