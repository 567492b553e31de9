"""Runs inside the engine venv: quantize a Hugging Face checkpoint with llm-compressor (AutoAWQ's maintained
successor); the output is in the compressed-tensors format that vLLM loads.

    ENGINE_PYTHON -m engine.llmc_quantize --model SRC_DIR --out OUT_DIR --scheme SCHEME [--group-size 128]
        [--bits 4] [--smoothquant 0.8] [--keep PATTERN ...] [--keep-as bf16|fp8]
        [--calib builtin|PATH] [--max-calib-samples 32] [--max-calib-seq-len 256]

Schemes (engine/quant_schemes.py has their words):
    w8a8-int8     int8 weights per output channel, int8 activations per token at run time (SmoothQuant first when
                  --smoothquant is given: it needs calibration text)
    fp8-dynamic   FP8 weights per channel, FP8 activations per token at run time; no calibration text
    w4a16-gptq    4-bit weights in groups, GPTQ (calibration text)
    w4a16-awq     4-bit asymmetric weights in groups, AWQ scales (calibration text)
    w4a16-rtn     --bits-bit weights in groups (--group-size -1: one scale per output row), round to nearest, no
                  calibration: the cheapest and the crudest (2 or 3 bits show what quantization can cost)
    mixed         4-bit GPTQ for every decoder linear except those --keep names, which stay BF16 or FP8

The protocol (JSON lines, engine/protocol.py), the output handling (a .partial folder renamed when complete, removed
on any failure or signal) and the failure kinds (engine/checkpoint.py) are shared with the AutoAWQ runner; the
result adds "backend" and "scheme".

Progress moves inside a layer: llm-compressor calibrates one decoder layer at a time over every sample, and this
script reports "calibrating layer i of N, sample j of M" with an estimate of the time left.

On a host without an accelerator AWQ's calibration cache is not pinned (`unpinned_calibration_cache`): pinning only
speeds a copy to a GPU, and there torch refuses it."""
import contextlib
import json
import re
import sys
import time
from pathlib import Path

from engine import awq_calibration, checkpoint, compute_dtype, protocol
from engine.protocol import JsonArgumentParser, RunnerError, progress, say
from engine.quant_schemes import CALIBRATED, SCHEMES, fused_groups

PROGRESS_FROM, PROGRESS_TO = 10, 90
REPORT_EVERY_SECONDS = 0.5


def parse_args(argv):
    parser = JsonArgumentParser(description="Quantize a checkpoint with llm-compressor.")
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--scheme", required=True, choices=sorted(SCHEMES))
    parser.add_argument("--group-size", type=int, default=128, help="-1: one scale per output channel")
    parser.add_argument("--bits", type=int, default=4, choices=[2, 3, 4, 8], help="weight bits of w4a16-rtn")
    parser.add_argument("--smoothquant", type=float, default=None, help="SmoothQuant strength (0-1) for w8a8-int8")
    parser.add_argument("--keep", action="append", default=[], help="mixed: a module name pattern to keep")
    parser.add_argument("--keep-as", choices=["bf16", "fp8"], default="bf16")
    parser.add_argument("--calib", default="builtin")
    parser.add_argument("--max-calib-samples", type=int, default=32)
    parser.add_argument("--max-calib-seq-len", type=int, default=256)
    args = parser.parse_args(argv)
    if args.group_size != -1 and args.group_size <= 0:
        parser.error(f"--group-size must be positive or -1, not {args.group_size}")
    if args.smoothquant is not None and not 0 < args.smoothquant < 1:
        parser.error(f"--smoothquant must be between 0 and 1, not {args.smoothquant}")
    if args.scheme == "mixed" and not args.keep:
        parser.error("mixed precision needs at least one --keep pattern")
    if args.max_calib_samples <= 0 or args.max_calib_seq_len < 16:
        parser.error("--max-calib-samples must be positive and --max-calib-seq-len at least 16")
    return args


def needs_calibration(args):
    return args.scheme in CALIBRATED or (args.scheme == "w8a8-int8" and args.smoothquant is not None)


# --- which modules ------------------------------------------------------------------------------------------

def linear_names(model):
    import torch

    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name != "lm_head" and not name.endswith(".lm_head")]


def pattern_matches(pattern, name):
    if pattern.startswith("re:"):
        return re.search(pattern[3:], name) is not None
    return pattern in name


def kept_modules(names, patterns):
    """The linears the patterns name, widened to whole fused groups (vLLM loads q/k/v and gate/up as one layer,
    so they must share one scheme). Raises RunnerError when a pattern names nothing."""
    kept = set()
    for pattern in patterns:
        matched = [name for name in names if pattern_matches(pattern, name)]
        if not matched:
            raise RunnerError("failed", f"the pattern {pattern!r} names no linear layer of this model (they are "
                                        f"named like {names[0]})")
        kept.update(matched)
    for name in list(kept):
        for group in fused_groups(name):
            kept.update(other for other in names if other in group)
    return sorted(kept)


def exact(names):
    return [f"re:^{re.escape(name)}$" for name in names]


# --- the recipe ---------------------------------------------------------------------------------------------

def weight_args(*, bits, group_size, symmetric):
    if group_size == -1:
        return {"num_bits": bits, "type": "int", "strategy": "channel", "symmetric": symmetric, "dynamic": False}
    return {"num_bits": bits, "type": "int", "strategy": "group", "group_size": group_size,
            "symmetric": symmetric, "dynamic": False}


INT8_ACTIVATIONS = {"num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True}
FP8_WEIGHTS = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
FP8_ACTIVATIONS = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}


def recipe(args, names):
    """The llm-compressor modifiers for `args.scheme`, and the modules kept out of quantization."""
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    ignore = ["lm_head"]
    scheme = args.scheme
    if scheme == "w8a8-int8":
        groups = {"group_0": {"targets": ["Linear"], "weights": weight_args(bits=8, group_size=-1, symmetric=True),
                              "input_activations": INT8_ACTIVATIONS}}
        modifiers = [QuantizationModifier(config_groups=groups, ignore=ignore)]
        if args.smoothquant is not None:
            from llmcompressor.modifiers.transform import SmoothQuantModifier

            modifiers.insert(0, SmoothQuantModifier(smoothing_strength=args.smoothquant))
        return modifiers, []
    if scheme == "fp8-dynamic":
        groups = {"group_0": {"targets": ["Linear"], "weights": FP8_WEIGHTS, "input_activations": FP8_ACTIVATIONS}}
        return [QuantizationModifier(config_groups=groups, ignore=ignore)], []
    if scheme == "w4a16-rtn":
        groups = {"group_0": {"targets": ["Linear"],
                              "weights": weight_args(bits=args.bits, group_size=args.group_size, symmetric=True)}}
        return [QuantizationModifier(config_groups=groups, ignore=ignore)], []
    if scheme == "w4a16-gptq":
        groups = {"group_0": {"targets": ["Linear"],
                              "weights": weight_args(bits=4, group_size=args.group_size, symmetric=True)}}
        return [GPTQModifier(config_groups=groups, ignore=ignore)], []
    if scheme == "w4a16-awq":
        from llmcompressor.modifiers.transform import AWQModifier

        groups = {"group_0": {"targets": ["Linear"],
                              "weights": weight_args(bits=4, group_size=args.group_size, symmetric=False)}}
        return [AWQModifier(), QuantizationModifier(config_groups=groups, ignore=ignore)], []
    if scheme == "mixed":
        kept = kept_modules(names, args.keep)
        quantized = [name for name in names if name not in kept]
        if not quantized:
            raise RunnerError("failed", "the --keep patterns name every linear layer: nothing is left to quantize")
        groups = {"group_0": {"targets": exact(quantized),
                              "weights": weight_args(bits=4, group_size=args.group_size, symmetric=True)}}
        if args.keep_as == "fp8":
            groups["group_1"] = {"targets": exact(kept), "weights": FP8_WEIGHTS,
                                 "input_activations": FP8_ACTIVATIONS}
        else:
            ignore = ignore + exact(kept)
        return [GPTQModifier(config_groups=groups, ignore=ignore)], kept
    raise RunnerError("failed", f"unknown scheme {scheme}")


# --- progress inside a layer --------------------------------------------------------------------------------

class CalibrationProgress:
    """Stands in for the tqdm that llm-compressor's sequential pipeline wraps each layer's batches in: every
    sample moves the bar, and the phase says the layer, the sample and the time left."""

    DESCRIPTION = re.compile(r"\((\d+)/(\d+)\): (\w+)")

    def __init__(self):
        self.started = None
        self.last_report = 0.0

    def wrap(self, iterable, total=None, desc="", **_):
        match = self.DESCRIPTION.search(desc or "")
        if not match:
            yield from iterable
            return
        layer, layers, action = int(match.group(1)), int(match.group(2)), match.group(3).lower()
        if self.started is None:
            self.started = time.monotonic()
        for index, item in enumerate(iterable):
            self.report(layer, layers, action, index, total)
            yield item
        self.report(layer, layers, action, total or 0, total, force=True)

    def report(self, layer, layers, action, done, total, force=False):
        now = time.monotonic()
        if not force and now - self.last_report < REPORT_EVERY_SECONDS:
            return
        self.last_report = now
        total = total or 1
        # Each layer is calibrated over every sample, then (GPTQ, AWQ) its outputs are propagated: half each.
        within = done / total / 2 + (0.5 if action == "propagating" else 0.0)
        fraction = min(1.0, ((layer - 1) + within) / layers)
        elapsed = now - self.started
        eta = ""
        if fraction > 0.02 and elapsed > 1:
            eta = f" · about {format_seconds(elapsed * (1 - fraction) / fraction)} left"
        percent = PROGRESS_FROM + int((PROGRESS_TO - PROGRESS_FROM) * fraction)
        progress(f"{action} layer {layer} of {layers}, sample {min(done + 1, total)} of {total}{eta}", percent)


def format_seconds(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def install_progress():
    """Hook CalibrationProgress into llm-compressor's pipeline; without the hook (a later release) the phases
    still move, only not inside a layer."""
    reporter = CalibrationProgress()
    try:
        from llmcompressor.pipelines.sequential import pipeline as sequential
    except ImportError:
        return None
    if hasattr(sequential, "tqdm"):
        sequential.tqdm = reporter.wrap
    return reporter


def forward_library_log():
    """llm-compressor logs through loguru: its messages become log lines of the job (not stderr noise)."""
    try:
        from loguru import logger
    except ImportError:
        return
    logger.remove()
    logger.add(lambda message: say(log=str(message).strip()[:500]), level="INFO", format="{message}")


# --- a host without an accelerator --------------------------------------------------------------------------

def accelerator_available(torch):
    accelerator = getattr(torch, "accelerator", None)  # torch 2.6 and later
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


@contextlib.contextmanager
def unpinned_calibration_cache(torch):
    """llm-compressor 0.14's AWQ pins its calibration cache (IntermediatesCache.pin_memory) before each smoothing,
    to copy it to the GPU faster; on a host without an accelerator torch refuses ("Cannot access accelerator device
    when none is available", at the second decoder layer). Pinning only speeds a copy to a device, so there the
    cache stays as it is, for the length of this block. Yields whether the patch is on."""
    try:
        from llmcompressor.pipelines.cache import IntermediatesCache
    except ImportError:  # a release without the cache has nothing to pin
        IntermediatesCache = None
    if accelerator_available(torch) or not hasattr(IntermediatesCache, "pin_memory"):
        yield False
        return
    pin = IntermediatesCache.pin_memory
    IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None
    try:
        yield True
    finally:
        IntermediatesCache.pin_memory = pin


# --- the run ------------------------------------------------------------------------------------------------

def calibration_dataset(args, tokenizer):
    from datasets import Dataset

    samples, info = checkpoint.prepare_calibration(args, tokenizer)
    encoded = [tokenizer(text, truncation=True, max_length=args.max_calib_seq_len) for text in samples]
    dataset = Dataset.from_dict({"input_ids": [item["input_ids"] for item in encoded],
                                 "attention_mask": [item["attention_mask"] for item in encoded]})
    return dataset, info


def quantize(args):
    started = time.monotonic()
    model_dir, out_dir = args.model.absolute(), args.out.absolute()
    progress("checking the model", 1)
    config = checkpoint.read_model_config(model_dir)
    checkpoint.check_not_quantized(model_dir, config)
    checkpoint.check_target(out_dir)
    if args.group_size != -1 and args.scheme not in ("w8a8-int8", "fp8-dynamic"):
        checkpoint.check_shapes(config, args.group_size)
    if args.calib != "builtin" and needs_calibration(args):
        with checkpoint.calibration_errors():
            awq_calibration.read_calibration_file(args.calib)
    with checkpoint.partial_folder(out_dir) as partial:
        result = quantize_into(args, model_dir, partial, out_dir)
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def quantize_into(args, model_dir, partial, out_dir):
    progress("loading llm-compressor", 2)
    import llmcompressor
    import torch
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    forward_library_log()
    version = getattr(llmcompressor, "__version__", "unknown")
    checkpoint.check_weights(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    dataset, calibration = None, None
    if needs_calibration(args):
        progress("preparing calibration data", 3)
        dataset, calibration = calibration_dataset(args, tokenizer)
        say(log=f"calibration: {calibration['samples']} samples, {calibration['tokens']} tokens")
    device, memory_kind, device_name = checkpoint.describe_device(torch)
    if memory_kind == "gpu":
        torch.cuda.reset_peak_memory_stats()
    progress("loading model", 5)
    timings, mark = {}, time.monotonic()
    compute = compute_dtype.compute_dtype(torch, device)
    if compute is not None:
        say(log=compute_dtype.describe(torch, device))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=compute or "auto", trust_remote_code=False,
                                                 device_map=device if memory_kind == "gpu" else None)
    timings["load"] = round(time.monotonic() - mark, 2)
    names = linear_names(model)
    modifiers, kept = recipe(args, names)
    reporter = install_progress()
    mark = time.monotonic()
    with unpinned_calibration_cache(torch) as unpinned:
        say(log=f"backend: llm-compressor {version} on {device_name or device}"
                + (" (no accelerator: the calibration cache is not pinned)" if unpinned else ""))
        if dataset is None:
            progress(f"quantizing {len(names)} linear layers (no calibration text needed)", 20)
            oneshot(model=model, recipe=modifiers, tokenizer=tokenizer)
        else:
            progress(f"calibrating {len(names)} linear layers", PROGRESS_FROM)
            oneshot(model=model, recipe=modifiers, tokenizer=tokenizer, dataset=dataset,
                    num_calibration_samples=len(dataset), max_seq_length=args.max_calib_seq_len,
                    shuffle_calibration_samples=False, pipeline="sequential")
    timings["quantize"] = round(time.monotonic() - mark, 2)

    progress("compressing and saving", 92)
    mark = time.monotonic()
    model.save_pretrained(str(partial), save_compressed=True)
    if compute is not None:
        checkpoint.store_as(torch, partial, checkpoint.checkpoint_dtype(checkpoint.read_model_config(model_dir)))
    saved = checkpoint.finish_output(model_dir, partial, out_dir, saved_by="llm-compressor")
    timings["save"] = round(time.monotonic() - mark, 2)
    result = {
        "backend": "llm-compressor", "backend_version": version, "scheme": args.scheme,
        "output_path": str(out_dir),
        "size_before_bytes": checkpoint.folder_size(model_dir),
        "size_after_bytes": checkpoint.folder_size(out_dir), "seconds": None,
        "peak_memory_bytes": checkpoint.peak_memory(torch, memory_kind), "peak_memory_kind": memory_kind,
        "device": device, "layers": int(json.loads((model_dir / "config.json").read_text()).get(
            "num_hidden_layers") or 0), "linear_layers": len(names), "kept_modules": kept,
        "quant_config": saved["quantization_config"], "calibration": calibration, "timings": timings,
        "model_type": saved.get("model_type"), "progress_inside_layers": reporter is not None,
    }
    if device_name:
        result["device_name"] = device_name
    return result


def main(argv=None):
    return protocol.run(quantize, parse_args=parse_args, classify=classify, argv=argv)


def classify(error, args):
    if isinstance(error, ImportError) and "llmcompressor" in str(error):
        return "engine_missing", (f"the engine venv ({sys.executable}) has no llm-compressor: "
                                  f"scripts/build_engine_venv.sh installs it. {error}")
    return checkpoint.classify(error, args)


if __name__ == "__main__":
    sys.exit(main())
