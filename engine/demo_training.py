"""Runs inside the engine venv: teach the demo model a little, so quantization has something to lose.

A few hundred optimizer steps on 2 cores (about a minute): next-token prediction on the same stdlib sources the
tokenizer was trained on, mixed with short chat turns whose answer is a JSON object (the quality report's JSON
check then has something to measure). Deterministic for one seed on one machine: the batches come from numpy's
PCG64, torch runs a fixed number of threads, and nothing is timed into the result.

The held-out text (engine/evaluation_text.py) and the calibration corpus (engine/awq_calibration.py) are other
stdlib modules: what the quality report measures was never trained on nor calibrated on."""
import math
import time

from engine import evaluation_text

SEQUENCE_TOKENS = 128
BATCH_SEQUENCES = 16
STEPS = 240
PEAK_LEARNING_RATE = 2e-3
WARMUP_STEPS = 12
JSON_SHARE = 0.3  # of the sequences in a batch
TRAINING_THREADS = 2  # fixed, so a build gives the same weights on a 2-core and on a 64-core machine


def training_windows(tokenizer, texts, *, sequence_tokens=SEQUENCE_TOKENS):
    """The corpus as one token stream cut into windows of `sequence_tokens` (a list of lists)."""
    stream = []
    for text in texts:
        stream.extend(tokenizer.encode(text, add_special_tokens=False))
        stream.append(tokenizer.eos_token_id)
    count = len(stream) // sequence_tokens
    return [stream[i * sequence_tokens:(i + 1) * sequence_tokens] for i in range(count)]


def json_windows(tokenizer, *, count, sequence_tokens=SEQUENCE_TOKENS):
    """Chat turns that answer with a JSON object, packed into windows (the training share of the JSON task)."""
    stream = []
    for index in range(count):
        messages = evaluation_text.json_turn(index, split="train")
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        stream.extend(tokenizer.encode(text, add_special_tokens=False))
    usable = len(stream) // sequence_tokens
    return [stream[i * sequence_tokens:(i + 1) * sequence_tokens] for i in range(usable)]


def learning_rate(step, steps):
    if step < WARMUP_STEPS:
        return PEAK_LEARNING_RATE * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return PEAK_LEARNING_RATE * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model, tokenizer, texts, *, seed, steps=STEPS, on_step=None):
    """Train `model` (float32, in place) and return {"steps", "tokens", "seconds", "first_loss", "last_loss"}.
    `on_step(step, steps, loss)` is called after every step."""
    import numpy as np
    import torch

    torch.set_num_threads(TRAINING_THREADS)
    torch.manual_seed(seed)
    corpus = torch.tensor(training_windows(tokenizer, texts), dtype=torch.long)
    chat = torch.tensor(json_windows(tokenizer, count=600), dtype=torch.long)
    rng = np.random.Generator(np.random.PCG64(seed + 1))
    chat_rows = int(BATCH_SEQUENCES * JSON_SHARE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK_LEARNING_RATE, betas=(0.9, 0.95), weight_decay=0.01)
    model.train()
    started = time.monotonic()
    first_loss = last_loss = None
    for step in range(steps):
        picks = rng.integers(0, len(corpus), BATCH_SEQUENCES - chat_rows)
        chat_picks = rng.integers(0, len(chat), chat_rows)
        batch = torch.cat([corpus[torch.from_numpy(picks)], chat[torch.from_numpy(chat_picks)]])
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        last_loss = float(loss)
        first_loss = last_loss if first_loss is None else first_loss
        if on_step is not None:
            on_step(step + 1, steps, last_loss)
    model.eval()
    return {"steps": steps, "tokens": steps * BATCH_SEQUENCES * SEQUENCE_TOKENS,
            "seconds": round(time.monotonic() - started, 1), "first_loss": round(first_loss, 3),
            "last_loss": round(last_loss, 3)}


def held_out_perplexity(model, tokenizer, *, max_tokens=4096, window=512):
    """Perplexity of `model` on the held-out text (the first `max_tokens` tokens, in windows of `window`)."""
    import torch

    ids = evaluation_text.held_out_ids(tokenizer, max_tokens)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, window):
            chunk = torch.tensor([ids[start:start + window]], dtype=torch.long)
            if chunk.shape[1] < 2:
                break
            loss = model(input_ids=chunk, labels=chunk).loss
            total += float(loss) * (chunk.shape[1] - 1)
            count += chunk.shape[1] - 1
    return round(math.exp(total / count), 3), count
