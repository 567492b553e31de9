"""Runs inside the engine venv: quantize a Hugging Face checkpoint to 4-bit AWQ with AutoAWQ.

    ENGINE_PYTHON -m engine.quantize_runner --model SRC_DIR --out OUT_DIR [--w-bit 4] [--group-size 128]
        [--no-zero-point] [--version GEMM|GEMV] [--calib builtin|PATH_TO_TEXT_FILE]
        [--max-calib-samples 128] [--max-calib-seq-len 512]

Talks back as JSON lines on stdout (see panel/jobs/runner.py), one object a line, flushed:
    {"phase": "checking the model", "progress": 1}
    {"phase": "preparing calibration data", "progress": 2}
    {"phase": "loading model", "progress": 5}
    {"phase": "calibrating layer 3 of 24", "progress": 16}        one a decoder layer, spread over 10-90 %
    {"phase": "saving", "progress": 95}
    {"result": {"output_path", "size_before_bytes", "size_after_bytes", "seconds", "peak_memory_bytes",
                "peak_memory_kind", "device", "layers", "quant_config", "calibration", ...}}   then exit 0
or, on any failure, {"error": {"kind": KIND, "reason": "..."}} and exit 1, KIND one of
    oom, engine_missing, unsupported_architecture, already_quantized, bad_calibration, disk_full, failed.
Library chatter (warnings) goes to stderr; AutoAWQ's own tqdm bars are switched off (our phases replace them).

The order is chosen so that a mistake costs seconds, not the minutes of loading a large model: the arguments,
the folders, config.json (already quantized? an architecture AutoAWQ knows?) and the calibration text (read,
tokenized with the model's own tokenizer, chunked, counted) are all checked before a single weight is loaded.

Calibration (no hub: AutoAWQ's default "pileval" set is a download): the builtin corpus or the user's file, made
into samples by engine/awq_calibration.py. At most max_calib_samples chunks are used, from the start of the text;
AutoAWQ concatenates them and cuts blocks of max_calib_seq_len tokens, so fewer than max_calib_seq_len tokens in all
would leave it nothing (bad_calibration).

Output: written into OUT_DIR + ".partial" and renamed to OUT_DIR only when complete; the partial folder is removed
on any failure, including SIGTERM/SIGINT (their handler raises SystemExit so the finally-blocks run). An OUT_DIR
that already exists is refused. The tokenizer files and generation_config.json are copied from SRC_DIR
(save_quantized writes neither the tokenizer nor the original generation config), and every file gets the mode a
plain open() gives (safetensors writes 0600).

Device: CUDA when torch.cuda.is_available() (AutoAWQ moves one decoder layer at a time to the GPU; peak memory is
torch.cuda.max_memory_allocated), else the CPU (peak memory is the process's maximum resident set size).
"""
import os
import sys
import time
import warnings
from pathlib import Path

from engine import awq_calibration, checkpoint, compute_dtype, protocol
from engine.checkpoint import (
    calibration_errors,
    check_not_quantized,
    check_shapes,
    check_weights,
    describe_device,
    folder_size,
    peak_memory,
    peak_rss,
    prepare_calibration,
    read_model_config,
)
from engine.protocol import JsonArgumentParser, RunnerError, progress, say

# No model hub is reachable from any machine here: fail fast instead of hanging on a network that is not there.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# AutoAWQ draws tqdm bars on stderr, which the worker folds into the job log as one long \r-joined line; the
# phases on stdout say the same. tqdm reads TQDM_* variables when it is imported, so this comes first.
os.environ.setdefault("TQDM_DISABLE", "1")

PROGRESS_LAYERS_FROM, PROGRESS_LAYERS_TO = 10, 90
def parse_args(argv):
    parser = JsonArgumentParser(description="Quantize a checkpoint to 4-bit AWQ with AutoAWQ.")
    parser.add_argument("--model", required=True, type=Path, help="the checkpoint folder to quantize")
    parser.add_argument("--out", required=True, type=Path, help="the folder to create (must not exist)")
    parser.add_argument("--w-bit", type=int, default=4, choices=[4],
                        help="weight bits (AutoAWQ's GEMM and GEMV kernels pack 4-bit weights only)")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--no-zero-point", dest="zero_point", action="store_false",
                        help="symmetric quantization (the default is asymmetric, with a zero point)")
    parser.add_argument("--version", type=str.upper, default="GEMM", choices=["GEMM", "GEMV"])
    parser.add_argument("--calib", default="builtin", help="'builtin' or the path of a UTF-8 text file")
    parser.add_argument("--max-calib-samples", type=int, default=128)
    parser.add_argument("--max-calib-seq-len", type=int, default=512)
    args = parser.parse_args(argv)
    if args.group_size <= 0:
        parser.error(f"--group-size must be positive, not {args.group_size}")
    if args.max_calib_samples <= 0:
        parser.error(f"--max-calib-samples must be positive, not {args.max_calib_samples}")
    if args.max_calib_seq_len < 16:
        parser.error(f"--max-calib-seq-len must be at least 16, not {args.max_calib_seq_len}")
    return args


# --- the engine ---------------------------------------------------------------------------------------------

def version_of_awq():
    import awq

    return getattr(awq, "__version__", "unknown")


def import_engine():
    """Import torch, transformers and AutoAWQ. Returns (torch, AutoAWQForCausalLM, AwqQuantizer, supported)."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # awq's "deprecated" banner, torch.jit
    import torch
    import transformers  # noqa: F401  (before the stand-in below: it records which packages exist at import)

    try:
        import datasets  # noqa: F401
    except ImportError:
        # AutoAWQ imports `datasets` at module load (awq/utils/calib_data.py) for load_dataset alone, which it
        # calls only when calib_data is a hub name. This script always passes a list of strings, so a host without
        # datasets (the GPU image has none, and its wheels pull in several more) can still quantize. The stand-in
        # exists only when the real package is absent, and says so if anything ever calls it.
        sys.modules["datasets"] = _datasets_stand_in()
    from awq import AutoAWQForCausalLM
    from awq.models.auto import AWQ_CAUSAL_LM_MODEL_MAP
    from awq.quantize.quantizer import AwqQuantizer

    return torch, AutoAWQForCausalLM, AwqQuantizer, sorted(AWQ_CAUSAL_LM_MODEL_MAP)


def _datasets_stand_in():
    import importlib.machinery
    import types

    module = types.ModuleType("datasets")
    module.__spec__ = importlib.machinery.ModuleSpec("datasets", None)

    def load_dataset(*args, **kwargs):
        raise RuntimeError("the `datasets` package is not installed in the engine venv; quantize_runner passes "
                           "its calibration text as a list and never loads a hub data set")

    module.load_dataset = load_dataset
    module.TOKENWISE_STAND_IN = True
    return module


def check_architecture(config, supported):
    model_type = config.get("model_type")
    if model_type in supported:
        return model_type
    common = [name for name in ("llama", "mistral", "qwen2", "qwen3", "gemma2", "phi3", "mixtral", "falcon")
              if name in supported]
    named = f"model_type '{model_type}'" if model_type else "no model_type (config.json names none)"
    raise RunnerError("unsupported_architecture",
                      f"AutoAWQ cannot quantize {named}; it supports {', '.join(common)} and "
                      f"{len(supported) - len(common)} more ({', '.join(n for n in supported if n not in common)})")


def reporting_quantizer(base):
    """AutoAWQ's quantizer, announcing each decoder layer as it starts on it. quantize() accepts a quantizer_cls
    for customization; _get_input_feat(layer, ...) is the first thing its loop does for every layer."""

    class ReportingQuantizer(base):
        def _get_input_feat(self, layer, named_linears):
            count = len(self.modules)
            index = next((i for i, module in enumerate(self.modules) if module is layer), None)
            if index is None:  # a future AutoAWQ that copies layers: count calls instead
                index = getattr(self, "_tokenwise_layers_seen", 0)
            self._tokenwise_layers_seen = index + 1
            span = PROGRESS_LAYERS_TO - PROGRESS_LAYERS_FROM
            progress(f"calibrating layer {index + 1} of {count}", PROGRESS_LAYERS_FROM + (span * index) // count)
            return super()._get_input_feat(layer, named_linears)

    return ReportingQuantizer


# --- the run ------------------------------------------------------------------------------------------------

def quantize(args):
    started = time.monotonic()
    model_dir = args.model.absolute()
    out_dir = args.out.absolute()

    progress("checking the model", 1)
    config = read_model_config(model_dir)
    check_not_quantized(model_dir, config)
    checkpoint.check_target(out_dir)
    if args.calib != "builtin":
        with calibration_errors():  # a missing, empty or binary file fails before the engine loads
            awq_calibration.read_calibration_file(args.calib)
    with checkpoint.partial_folder(out_dir) as partial:
        result = quantize_into(args, config, model_dir, partial, out_dir)
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def quantize_into(args, config, model_dir, partial, out_dir):
    torch, AutoAWQForCausalLM, AwqQuantizer, supported = import_engine()
    check_architecture(config, supported)
    check_weights(model_dir)
    check_shapes(config, args.group_size)

    progress("preparing calibration data", 2)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    samples, calibration = prepare_calibration(args, tokenizer)
    say(log=f"calibration: {calibration['samples']} samples, {calibration['tokens']} tokens "
            f"({calibration['blocks']} blocks of {args.max_calib_seq_len})")

    device, memory_kind, device_name = describe_device(torch)
    version = version_of_awq()
    say(log=f"backend: AutoAWQ {version} on {device_name or device}")
    if memory_kind == "gpu":
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
    progress("loading model", 5)
    timings = {}
    mark = time.monotonic()
    # trust_remote_code=False: a checkpoint folder's own Python is never run by a quantization job.
    compute = compute_dtype.compute_dtype(torch, device)
    if compute is not None:
        say(log=compute_dtype.describe(torch, device))
    model = AutoAWQForCausalLM.from_pretrained(str(model_dir), trust_remote_code=False, low_cpu_mem_usage=True,
                                               use_cache=False, torch_dtype=compute or "auto")
    timings["load"] = round(time.monotonic() - mark, 2)

    quant_config = {"zero_point": args.zero_point, "q_group_size": args.group_size, "w_bit": args.w_bit,
                    "version": args.version}
    mark = time.monotonic()
    model.quantize(tokenizer, quant_config=quant_config, calib_data=samples,
                   max_calib_samples=args.max_calib_samples, max_calib_seq_len=args.max_calib_seq_len,
                   quantizer_cls=reporting_quantizer(AwqQuantizer))
    timings["quantize"] = round(time.monotonic() - mark, 2)
    layers = len(model.quantizer.modules)

    progress("saving", 95)
    mark = time.monotonic()
    model.save_quantized(str(partial))
    if compute is not None:
        checkpoint.store_as(torch, partial, checkpoint.checkpoint_dtype(config))
    saved_config = checkpoint.finish_output(model_dir, partial, out_dir, saved_by="AutoAWQ")
    timings["save"] = round(time.monotonic() - mark, 2)

    result = {
        "backend": "autoawq", "backend_version": version, "scheme": "w4a16-awq",
        "output_path": str(out_dir),
        "size_before_bytes": folder_size(model_dir),
        "size_after_bytes": folder_size(out_dir),
        "seconds": None,  # set by quantize()
        "peak_memory_bytes": peak_memory(torch, memory_kind),
        "peak_memory_kind": memory_kind,
        "device": device,
        "layers": layers,
        "quant_config": saved_config["quantization_config"],
        "calibration": calibration,
        "model_type": config.get("model_type"),
        "timings": timings,
        "peak_rss_bytes": peak_rss(),
    }
    if device_name:
        result["device_name"] = device_name
    return result


def main(argv=None):
    return protocol.run(quantize, parse_args=parse_args, classify=checkpoint.classify, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
