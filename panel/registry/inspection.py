"""Read what a checkpoint folder is without loading it: config.json and the safetensors headers.

Pure Python (no torch): the panel never imports the engines. Raises CheckpointError with a reason in words."""
import json
import math
import struct
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

MAX_HEADER_BYTES = 100 * 1024 * 1024
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U8": 1, "BOOL": 1}
DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8", "F8_E5M2": "float8"}
QUANT_METHODS = ("awq", "gptq", "bitsandbytes", "fp8", "compressed-tensors", "marlin", "squeezellm")


class CheckpointError(Exception):
    """The folder is not a model checkpoint we can read; the message says why."""


@dataclass
class CheckpointFacts:
    architecture: str
    model_type: str
    parameter_count: int
    linear_parameter_count: int  # decoder linear layers: the part AWQ/FP8 quantize
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    hidden_size: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    vocab_size: int
    dtype: str
    size_bytes: int
    quantization: dict = field(default_factory=dict)  # {} when not quantized

    def as_dict(self):
        return asdict(self)


def read_json(path, what):
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except UnicodeDecodeError:
        raise CheckpointError(f"{what} is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{what} is not valid JSON (line {error.lineno}: {error.msg})") from None
    except OSError as error:
        raise CheckpointError(f"{what} cannot be read ({error.strerror})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{what} is not a JSON object")
    return value


def safetensors_header(path):
    """The tensor table of one .safetensors file: {name: {"dtype", "shape", ...}}."""
    try:
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path.name} is truncated")
            (length,) = struct.unpack("<Q", prefix)
            if length == 0 or length > MAX_HEADER_BYTES:
                raise CheckpointError(f"{path.name} is not a safetensors file (header length {length})")
            raw = handle.read(length)
    except OSError as error:
        raise CheckpointError(f"{path.name} cannot be read ({error.strerror})") from None
    if len(raw) < length:
        raise CheckpointError(f"{path.name} is truncated")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path.name} has a corrupt header") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path.name} has a corrupt header")
    header.pop("__metadata__", None)
    return header


def quantization_of(folder, config):
    """{"method", "bits", "group_size", "zero_point", "version"} of an already-quantized checkpoint, else {}."""
    settings = config.get("quantization_config")
    source = "config.json quantization_config"
    if not isinstance(settings, dict):
        settings = None
        for name in ("quantize_config.json", "quant_config.json"):
            if (folder / name).is_file():
                settings = read_json(folder / name, name)
                source = name
                break
    if not settings:
        return {}
    method = str(settings.get("quant_method") or settings.get("quant_type") or "").lower()
    if not method:
        method = "gptq" if "desc_act" in settings else "awq" if "zero_point" in settings else "unknown"
    if settings.get("load_in_4bit") or settings.get("load_in_8bit"):
        method = "bitsandbytes"
    if method == "compressed-tensors":
        return compressed_tensors_facts(settings, source)
    return {
        "method": method,
        "bits": settings.get("bits") or settings.get("w_bit") or (4 if settings.get("load_in_4bit") else None),
        "group_size": settings.get("group_size") or settings.get("q_group_size"),
        "zero_point": settings.get("zero_point"),
        "version": str(settings.get("version") or "").lower() or None,
        "source": source,
    }


def compressed_tensors_facts(settings, source):
    """llm-compressor's format: one or more config groups, each with its weights' (and activations') numbers."""
    groups = [group for group in (settings.get("config_groups") or {}).values() if isinstance(group, dict)]
    weights = [group.get("weights") or {} for group in groups]
    activations = [group.get("input_activations") or {} for group in groups]
    bits = min((w.get("num_bits") for w in weights if w.get("num_bits")), default=None)
    group_sizes = [w.get("group_size") for w in weights if w.get("strategy") == "group" and w.get("group_size")]
    kinds = sorted({f"W{w.get('num_bits')}A{(a or {}).get('num_bits') or 16}"
                    + ("-FP" if w.get("type") == "float" else "") for w, a in zip(weights, activations)})
    return {
        "method": "compressed-tensors",
        "bits": bits,
        "group_size": group_sizes[0] if group_sizes else None,
        "zero_point": any(w.get("symmetric") is False for w in weights),
        "version": None,
        "format": settings.get("format"),
        "weights": kinds,
        "ignore": [name for name in settings.get("ignore") or [] if isinstance(name, str)][:50],
        "source": source,
    }


def logical_elements(name, spec, bits):
    """How many model parameters a tensor holds. Packed AWQ/GPTQ weights hold 32/bits per int32;
    their zeros and scales are quantization overhead, not parameters."""
    numel = math.prod(spec.get("shape") or [1])
    if name.endswith((".qzeros", ".scales", ".g_idx", ".weight_scale", ".input_scale", ".weight_zero_point",
                      ".weight_shape", ".weight_g_idx")):
        return 0
    if name.endswith(".weight_packed") and spec.get("dtype") == "I32":  # compressed-tensors' packed 4-bit
        return numel * (32 // (bits or 4))
    if name.endswith(".qweight") and spec.get("dtype") == "I32":
        return numel * (32 // (bits or 4))
    return numel


def is_decoder_linear(name, spec):
    return ".layers." in name and len(spec.get("shape") or []) == 2 and not name.endswith(("norm.weight",))


def inspect_checkpoint(folder):
    """CheckpointFacts of the model in `folder`, or CheckpointError."""
    folder = Path(folder)
    if not folder.exists():
        raise CheckpointError(f"{folder} does not exist")
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is a file, not a model folder")
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} is not a model: it has no config.json")
    config = read_json(folder / "config.json", "config.json")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        if list(folder.glob("*.bin")) or list(folder.glob("*.pt")):
            raise CheckpointError("only .bin/.pt weights found: Tokenwise reads .safetensors checkpoints "
                                  "(convert with transformers' save_pretrained(safe_serialization=True))")
        raise CheckpointError(f"{folder} has no .safetensors weights")
    quantization = quantization_of(folder, config)
    bits = quantization.get("bits") if quantization else None
    total = linear = 0
    dtypes = Counter()
    for path in weights:
        for name, spec in safetensors_header(path).items():
            if not isinstance(spec, dict) or "dtype" not in spec:
                raise CheckpointError(f"{path.name} has a corrupt entry for {name!r}")
            elements = logical_elements(name, spec, bits)
            total += elements
            plain = name.replace(".qweight", ".weight").replace(".weight_packed", ".weight")
            if is_decoder_linear(plain, spec) and elements:
                linear += elements
            if spec["dtype"] in DTYPE_NAMES:
                dtypes[DTYPE_NAMES[spec["dtype"]]] += elements
    architectures = config.get("architectures") or []
    try:
        heads = int(text.get("num_attention_heads") or 0)
        hidden = int(text.get("hidden_size") or 0)
        layers = int(text.get("num_hidden_layers") or 0)
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or (hidden // heads if heads else 0))
    except (TypeError, ValueError):
        raise CheckpointError("config.json has non-numeric sizes (hidden_size, num_attention_heads...)") from None
    if not (heads and hidden and layers):
        raise CheckpointError("config.json lacks hidden_size, num_attention_heads or num_hidden_layers: "
                              "not a decoder-only language model Tokenwise can serve")
    declared = str(config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype") or "")
    if not quantization:
        _check_weights_present(text, str(config.get("model_type") or ""), linear, hidden=hidden, layers=layers,
                               heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    return CheckpointFacts(
        architecture=architectures[0] if architectures else str(config.get("model_type", "unknown")),
        model_type=str(config.get("model_type") or text.get("model_type") or "unknown"),
        parameter_count=total,
        linear_parameter_count=linear,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        hidden_size=hidden,
        head_dim=head_dim,
        intermediate_size=int(text.get("intermediate_size") or 0),
        max_position_embeddings=int(text.get("max_position_embeddings") or 0),
        vocab_size=int(text.get("vocab_size") or 0),
        dtype=declared or (dtypes.most_common(1)[0][0] if dtypes else "unknown"),
        size_bytes=folder_size(folder),
        quantization=quantization,
    )


CHECK_MIN_PARAMETERS = 100_000_000  # the check as a model judges from here up (panel/registry/model_check.py)
# Dense decoders whose linear weights follow from config.json alone: q, k, v, o and the gated MLP per layer.
DENSE_DECODERS = {"llama", "qwen2", "qwen3", "mistral"}
PRESENT_SHARE = 0.9


def _check_weights_present(text, model_type, linear, *, hidden, layers, heads, kv_heads, head_dim):
    """CheckpointError when the files hold far fewer decoder weights than config.json describes (shards missing, a
    copy that stopped): transformers would load such a folder with random values in their place. Only for the dense
    decoders above, and only from the size the model check judges (smaller test models are left alone)."""
    if model_type not in DENSE_DECODERS or any(key in text for key in ("num_experts", "num_local_experts")):
        return
    intermediate = int(text.get("intermediate_size") or 0)
    expected = layers * (2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * intermediate)
    embeddings = int(text.get("vocab_size") or 0) * hidden * (1 if text.get("tie_word_embeddings", True) else 2)
    if expected + embeddings < CHECK_MIN_PARAMETERS or linear >= PRESENT_SHARE * expected:
        return
    raise CheckpointError(f"Its weight files hold {linear:,} of the {expected:,} decoder weights its config.json "
                          f"describes ({100 * linear / expected:.0f}%): shards are missing or a copy did not finish")


def folder_size(folder):
    return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())
