"""A safetensors file written by hand (header and zeroed tensors), for reading checkpoints without loading them."""
import json
import struct


def write_safetensors(path, tensors):
    """A real safetensors file: header + zero-filled data."""
    header, offset = {}, 0
    sizes = {"F16": 2, "BF16": 2, "F32": 4, "I32": 4, "I8": 1}
    for name, (dtype, shape) in tensors.items():
        size = sizes[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
