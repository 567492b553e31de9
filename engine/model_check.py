"""Runs inside the engine venv: check a checkpoint as a model, not as files. A conversion can succeed and still be
wrong (a loader that misreads one tensor type gives a model that repeats one word), so after an import the saved
folder is loaded back and measured: the weights its files lack (transformers would fill them with random values),
perplexity on the held-out text and one greedy chat answer. The figures go
back to the panel, which holds the bounds and decides (panel/registry/gguf_import.py).

    ENGINE_PYTHON -m engine.model_check --model DIR [--max-tokens 1024]

Prints the protocol's JSON lines (engine/protocol.py); the result is the figures."""
import time
from pathlib import Path

from engine import checkpoint, protocol
from engine.evaluate_transformers import greedy_ids, held_out_perplexity
from engine.evaluation_common import held_out_windows
from engine.protocol import JsonArgumentParser, RunnerError, say

QUESTION = "What is the capital of France? Answer in one word."
EXPECTED_WORD = "Paris"
ANSWER_TOKENS = 24
# One window of held-out text: enough to tell a working model (SmolLM2-135M: 13.2) from a broken one (thousands),
# in about 10 s on 2 busy cores.
CHECK_TOKENS = 512


def check(model_dir, *, max_tokens=CHECK_TOKENS, progress_from=0, progress_to=100):
    """The figures of the checkpoint at `model_dir`: perplexity on `max_tokens` held-out tokens and the greedy
    answer (text and token ids) to one factual question."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    span = progress_to - progress_from
    say(phase="checking the model: loading it back", progress=progress_from)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    # float32 on a CPU: the check is a few forward passes, and CPUs without bf16 units run float32 faster.
    dtype = "auto" if device == "cuda" else torch.float32
    model, loading = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, device_map=device,
                                                          output_loading_info=True)
    model.eval()
    # Weights the files do not hold are filled with random values by transformers: the model loads, and is not one.
    missing = sorted(loading.get("missing_keys") or [])
    if not held_out_windows(tokenizer, max_tokens):  # nothing to score: a perplexity would divide by zero
        raise RunnerError("no_tokenizer", f"its tokenizer turns the held-out text into no tokens: {model_dir} has "
                                          "no working tokenizer (tokenizer.json, tokenizer_config.json)")
    say(phase="checking the model: perplexity on held-out text", progress=progress_from + span // 3)
    perplexity, scored, _ = held_out_perplexity(model, tokenizer, device, max_tokens)
    say(phase="checking the model: a greedy answer", progress=progress_from + 2 * span // 3)
    if getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                               add_generation_prompt=True)
    else:  # a base model without a chat template: the question as plain text
        prompt = QUESTION + "\n"
    ids = greedy_ids(model, tokenizer, device, prompt, ANSWER_TOKENS)
    answer = tokenizer.decode(ids, skip_special_tokens=True)
    special = set(tokenizer.all_special_ids) | {tokenizer.eos_token_id, tokenizer.pad_token_id}
    return {"perplexity": perplexity, "tokens_scored": scored, "question": QUESTION, "answer": answer.strip(),
            "answer_token_ids": [token for token in ids if token not in special],
            "expected_word": EXPECTED_WORD, "mentions_expected": EXPECTED_WORD.lower() in answer.lower(),
            "parameters": sum(parameter.numel() for parameter in model.parameters()),
            "missing_weights": len(missing), "missing_examples": missing[:3],
            "weight_tensors": len(model.state_dict()),
            "seconds": round(time.monotonic() - started, 1)}


def parse_args(argv):
    parser = JsonArgumentParser(description="Check a checkpoint as a model: perplexity and a greedy answer.")
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--max-tokens", type=int, default=CHECK_TOKENS)
    return parser.parse_args(argv)


def main(argv=None):
    def body(args):
        checkpoint.read_model_config(args.model)  # a folder without config.json: an error in words
        return check(args.model.absolute(), max_tokens=args.max_tokens)

    return protocol.run(body, parse_args=parse_args, classify=checkpoint.classify, argv=argv)


if __name__ == "__main__":
    raise SystemExit(main())
