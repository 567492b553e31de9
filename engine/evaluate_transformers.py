"""Runs inside the engine venv: engine/evaluate.py's measurements with transformers, for a checkpoint vLLM cannot
load (2- or 3-bit weights, quantized to show what quantization can cost). The same inputs, the same greedy
decoding and the same chat template; compressed-tensors decompresses the weights, so the numbers are those of the
quantized weights."""
import time

from engine import compute_dtype, evaluation_text, quality_tasks
from engine.evaluation_common import FILE_TOKENS, GREEDY_TOKENS, file_result, folder_size, held_out_windows
from engine.protocol import say


def evaluate_one(model_dir, *, config, file_items, max_tokens):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    say(phase=f"loading {model_dir.name} with transformers (vLLM cannot load it)", progress=5)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    compute = compute_dtype.compute_dtype(torch, device)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=compute or "auto", device_map=device).eval()
    result = {"path": str(model_dir), "size_bytes": folder_size(model_dir), "engine": "transformers",
              "quantization": (config.get("quantization_config") or {}).get("quant_method") or "none",
              "speed": None}  # not this host's engine: its speed would mislead

    say(phase="perplexity on held-out text", progress=40)
    perplexity, count, argmax = held_out_perplexity(model, tokenizer, device, max_tokens)
    result.update(perplexity=perplexity, tokens_scored=count, argmax=argmax)

    def greedy(text, tokens):
        return greedy_ids(model, tokenizer, device, text, tokens)

    def chat(messages, tokens):
        return chat_answer(model, tokenizer, device, messages, tokens)

    say(phase="greedy continuations", progress=60)
    result["greedy"] = [greedy(prompt, GREEDY_TOKENS) for prompt in evaluation_text.AGREEMENT_PROMPTS]
    say(phase="the task set", progress=70)
    items = quality_tasks.tasks()
    result["tasks"] = quality_tasks.score(items, [chat(item["messages"], quality_tasks.ANSWER_TOKENS)
                                                  for item in items])
    if file_items:
        result["file"] = file_result(file_items, [
            chat(item["messages"], FILE_TOKENS) if "messages" in item
            else tokenizer.decode(greedy(item["prompt"], FILE_TOKENS), skip_special_tokens=True)
            for item in file_items])
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def held_out_perplexity(model, tokenizer, device, max_tokens):
    """(perplexity, tokens scored, the argmax token at each scored position) of `model` on the held-out text."""
    import math

    import torch

    total, count, argmax = 0.0, 0, []
    with torch.no_grad():
        for window in held_out_windows(tokenizer, max_tokens):
            ids = torch.tensor([window], device=device)
            logits = model(input_ids=ids).logits.float()[0, :-1]
            total += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
            count += ids.shape[1] - 1
            argmax.extend(logits.argmax(-1).tolist())
    return round(math.exp(total / count), 4), count, argmax


def greedy_ids(model, tokenizer, device, text, tokens):
    """The token ids `model` continues `text` with, greedily (at most `tokens`, at least one)."""
    import torch

    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(device)
    with torch.no_grad():
        output = model.generate(**ids, max_new_tokens=tokens, min_new_tokens=1, do_sample=False,
                                pad_token_id=tokenizer.pad_token_id)
    return output[0, ids["input_ids"].shape[1]:].tolist()


def chat_answer(model, tokenizer, device, messages, tokens):
    """The greedy answer to chat `messages` through the model's own chat template, as text."""
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.decode(greedy_ids(model, tokenizer, device, prompt, tokens), skip_special_tokens=True)
