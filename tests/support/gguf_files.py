"""GGUF files written by hand (header, metadata, tensor table and zeroed data), for the import's checks without the
engine. The format as gguf 0.19.0's GGUFWriter writes it (version 3, little-endian, data aligned to 32 bytes);
tests/registry/test_gguf_import_engine.py has the engine's gguf package read one back."""
import struct

ALIGNMENT = 32
Q4_1, F32 = 3, 0
BLOCKS = {Q4_1: (32, 20), F32: (1, 4)}  # elements per block, bytes per block
FILE_TYPE_Q4_1 = 3


def _string(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _value(value):
    """(type, bytes) of a metadata value: str, int (u32), float (f32), a list of str."""
    if isinstance(value, str):
        return 8, _string(value)
    if isinstance(value, bool):
        return 7, struct.pack("<?", value)
    if isinstance(value, int):
        return 4, struct.pack("<I", value)
    if isinstance(value, float):
        return 6, struct.pack("<f", value)
    if isinstance(value, list):
        return 9, struct.pack("<IQ", 8, len(value)) + b"".join(_string(item) for item in value)
    raise TypeError(value)


def write_gguf(path, *, architecture="llama", metadata=None, tensors=None, magic=b"GGUF"):
    """A GGUF file at `path`: `architecture` (None: not named), general.file_type Q4_1, a small tokenizer list, and
    `tensors` ({name: (type, shape)}; default one Q4_1 matrix and one F32 norm) filled with zeros. Returns its
    size in bytes."""
    tensors = tensors or {"blk.0.attn_q.weight": (Q4_1, [64, 8]), "blk.0.attn_norm.weight": (F32, [64])}
    entries = {"general.name": "Tiny Test", "general.file_type": FILE_TYPE_Q4_1, "general.license": "apache-2.0",
               "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "<|im_end|>"]}
    if architecture is not None:
        entries = {"general.architecture": architecture, **entries}
    entries.update(metadata or {})
    header = magic + struct.pack("<IQQ", 3, len(tensors), len(entries))
    for key, value in entries.items():
        kind, data = _value(value)
        header += _string(key) + struct.pack("<I", kind) + data
    offset, blobs = 0, []
    for name, (kind, shape) in tensors.items():
        elements = 1
        for dimension in shape:
            elements *= dimension
        block, block_bytes = BLOCKS[kind]
        size = elements // block * block_bytes
        header += _string(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        header += struct.pack("<IQ", kind, offset)
        padded = size + (-size % ALIGNMENT)
        blobs.append(b"\0" * padded)
        offset += padded
    header += b"\0" * (-len(header) % ALIGNMENT)
    data = header + b"".join(blobs)
    path.write_bytes(data)
    return len(data)
