"""Read what a GGUF file is without the engine: its header, metadata and tensor table (pure Python; the panel
never imports the engine's packages). Enough to refuse, before any job, a file that is not GGUF, is truncated or
holds an architecture transformers' GGUF loader cannot load. The engine reads it again with the `gguf` package
(engine/gguf_import.py) and that reading is what the model records.

The format (version 2 and 3, little-endian): "GGUF", version u32, tensor count u64, metadata count u64; each
metadata entry a string key, a u32 value type and the value; each tensor a name, its dimensions, a u32 type and an
offset into the data, which starts at the next multiple of general.alignment (32 by default)."""
import struct
from collections import Counter
from dataclasses import dataclass, field

MAGIC = b"GGUF"
MAX_STRING_BYTES = 64 * 1024 * 1024  # a chat template or a tokenizer entry; more means a damaged file
MAX_TENSORS = 1_000_000
MAX_DIMENSIONS = 8

# Value types: (struct format, size) for the fixed-size ones; 8 is a string, 9 an array.
SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
           7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
STRING, ARRAY = 8, 9

# GGML tensor types: name, elements per block, bytes per block (gguf 0.19.0, gguf/constants.py GGML_QUANT_SIZES).
QK_K = 256
TENSOR_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 2 + 2 + QK_K // 16 + QK_K // 4),
    11: ("Q3_K", 256, 2 + QK_K // 4 + QK_K // 8 + 12), 12: ("Q4_K", 256, 2 + 2 + QK_K // 2 + 12),
    13: ("Q5_K", 256, 2 + 2 + QK_K // 2 + QK_K // 8 + 12), 14: ("Q6_K", 256, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    15: ("Q8_K", 256, 4 + QK_K + QK_K // 8), 16: ("IQ2_XXS", 256, 2 + QK_K // 4),
    17: ("IQ2_XS", 256, 2 + QK_K // 4 + QK_K // 32), 18: ("IQ3_XXS", 256, 2 + QK_K // 4 + QK_K // 8),
    19: ("IQ1_S", 256, 2 + QK_K // 8 + QK_K // 16), 20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4), 22: ("IQ2_S", 256, 2 + QK_K // 4 + QK_K // 16),
    23: ("IQ4_XS", 256, 2 + 2 + QK_K // 2 + QK_K // 64), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4),
    27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, QK_K // 8 + QK_K // 16 + QK_K // 32),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 2 + 4 * 13), 35: ("TQ2_0", 256, 2 + 64), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}
UNQUANTIZED = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}

# general.file_type (llama.cpp's llama_ftype; gguf 0.19.0 LlamaFileType, without its MOSTLY_ prefix).
FILE_TYPES = {
    0: "ALL_F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS",
    20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
    39: "NVFP4", 40: "Q1_0",
}

# The architectures transformers 5.17's GGUF loader reads (transformers/modeling_gguf_pytorch_utils.py,
# GGUF_SUPPORTED_ARCHITECTURES, with the renames load_gguf_checkpoint makes: "qwen2moe" is qwen2_moe...), less
# the encoder-decoder ones (t5, umt5: not causal chat models). The engine asks its own transformers again.
SUPPORTED_ARCHITECTURES = (
    "llama", "mistral", "qwen2", "qwen2moe", "qwen2_moe", "gpt-oss", "gpt_oss", "lfm2", "qwen3", "qwen3moe",
    "qwen3_moe", "falcon", "phi3", "bloom", "stablelm", "gpt2", "starcoder2", "mamba", "nemotron", "gemma2",
    "gemma3", "gemma4", "deci", "minimax-m2", "minimax_m2",
)


class GgufError(Exception):
    """The file is not a GGUF file we can import; the message says why, in words."""


@dataclass
class GgufFacts:
    version: int
    architecture: str
    name: str
    license: str
    file_type: str  # "Q4_1", or "" when the file does not say
    tensor_count: int
    tensor_types: dict = field(default_factory=dict)  # {"Q4_1": 210, "F32": 61, ...}
    size_bytes: int = 0
    data_bytes: int = 0  # where the last tensor ends: the size a complete file has at least
    parameters: int = 0  # the tensors' declared elements

    @property
    def bf16_bytes(self):
        """What the import writes (and the converting host holds in memory): every parameter as bf16."""
        return self.parameters * 2

    @property
    def quantization(self):
        """The file's quantization in one word: general.file_type, else the most common quantized tensor type."""
        if self.file_type:
            return self.file_type
        quantized = Counter({name: count for name, count in self.tensor_types.items() if name not in UNQUANTIZED})
        return quantized.most_common(1)[0][0] if quantized else "F32"

    @property
    def is_quantized(self):
        return any(name not in UNQUANTIZED for name in self.tensor_types)


class Reader:
    def __init__(self, handle, name):
        self.handle, self.name = handle, name

    def take(self, count):
        data = self.handle.read(count)
        if len(data) < count:
            raise GgufError(f"{self.name} is truncated: it ends inside its header")
        return data

    def unpack(self, form, size):
        return struct.unpack(form, self.take(size))[0]

    def string(self):
        length = self.unpack("<Q", 8)
        if length > MAX_STRING_BYTES:
            raise GgufError(f"{self.name} is damaged: a text entry claims {length} bytes")
        return self.take(length).decode("utf-8", errors="replace")

    def value(self, kind, *, keep=True):
        if kind in SCALARS:
            form, size = SCALARS[kind]
            return self.unpack(form, size)
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item_kind, count = self.unpack("<I", 4), self.unpack("<Q", 8)
            if item_kind in SCALARS:  # skipped: a tokenizer's scores and types are large and not needed here
                self.handle.seek(SCALARS[item_kind][1] * count, 1)
                return None
            items = [self.value(item_kind, keep=keep) for _ in range(count)]
            return items if keep else None
        raise GgufError(f"{self.name} is damaged: unknown metadata type {kind}")


def read_gguf(path):
    """The GgufFacts of the file at `path`, or GgufError saying what is wrong with it."""
    name = path.name
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            return _read(Reader(handle, name), size)
    except OSError as error:
        raise GgufError(f"{name} cannot be read ({error.strerror})") from None
    except struct.error:
        raise GgufError(f"{name} is damaged: its header cannot be read") from None


def _read(reader, size):
    name = reader.name
    if reader.handle.read(4) != MAGIC:
        raise GgufError(f"{name} is not a GGUF file (it does not start with 'GGUF')")
    version = reader.unpack("<I", 4)
    if version not in (2, 3):
        raise GgufError(f"{name} is GGUF version {version}; only versions 2 and 3 are read")
    tensor_count, metadata_count = reader.unpack("<Q", 8), reader.unpack("<Q", 8)
    if tensor_count > MAX_TENSORS:
        raise GgufError(f"{name} is damaged: it claims {tensor_count} tensors")
    metadata = {}
    for _ in range(metadata_count):
        key = reader.string()
        kind = reader.unpack("<I", 4)
        keep = not key.startswith("tokenizer.")
        value = reader.value(kind, keep=keep)
        if keep:
            metadata[key] = value
    tensors = []
    for _ in range(tensor_count):
        tensor_name = reader.string()
        dimensions = reader.unpack("<I", 4)
        if dimensions > MAX_DIMENSIONS:
            raise GgufError(f"{name} is damaged: tensor {tensor_name} claims {dimensions} dimensions")
        shape = [reader.unpack("<Q", 8) for _ in range(dimensions)]
        kind, offset = reader.unpack("<I", 4), reader.unpack("<Q", 8)
        if kind not in TENSOR_TYPES:
            raise GgufError(f"{name}: tensor {tensor_name} has a tensor type ({kind}) this version does not know")
        tensors.append((tensor_name, shape, kind, offset))
    alignment = metadata.get("general.alignment") or 32
    start = reader.handle.tell()
    data_start = start + (-start % alignment)
    data_end, parameters = data_start, 0
    for tensor_name, shape, kind, offset in tensors:
        _, block, block_bytes = TENSOR_TYPES[kind]
        elements = 1
        for dimension in shape:
            elements *= dimension
        parameters += elements
        data_end = max(data_end, data_start + offset + elements // block * block_bytes)
    if data_end > size:
        raise GgufError(f"{name} is truncated: its tensors need {data_end:,} bytes and the file has {size:,} "
                        f"(an interrupted download or copy?)")
    file_type = metadata.get("general.file_type")
    return GgufFacts(
        version=version, architecture=str(metadata.get("general.architecture") or ""),
        name=str(metadata.get("general.name") or ""), license=str(metadata.get("general.license") or ""),
        file_type=FILE_TYPES.get(file_type, f"file type {file_type}") if isinstance(file_type, int) else "",
        tensor_count=tensor_count, tensor_types=dict(Counter(TENSOR_TYPES[kind][0] for _, _, kind, _ in tensors)),
        size_bytes=size, data_bytes=data_end, parameters=parameters)


def architecture_refusal(facts):
    """Why transformers' GGUF loader cannot load this file's architecture, or None."""
    if not facts.architecture:
        return "the file does not name its architecture (general.architecture)"
    if facts.architecture in ("t5", "t5encoder", "umt5"):
        return f"{facts.architecture} is an encoder-decoder model; Tokenwise imports causal chat models"
    if facts.architecture not in SUPPORTED_ARCHITECTURES:
        return (f"transformers cannot load GGUF models of the architecture {facts.architecture!r}; it loads "
                f"{', '.join(sorted({a.replace('-', '_') for a in SUPPORTED_ARCHITECTURES}))}")
    return None
