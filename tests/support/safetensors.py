"""A safetensors file written by hand (header and zeroed tensors), for reading checkpoints without loading them."""
import json
import struct


def keep_tensors(source, target, keep):
    """Copy the safetensors file `source` to `target` with only the tensors whose name `keep(name)` accepts (their
    bytes as they were), as a checkpoint that lost the others would be."""
    with open(source, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        data = handle.read()
    kept, chunks, offset = {}, [], 0
    for name, entry in header.items():
        if name == "__metadata__":
            kept[name] = entry
            continue
        if not keep(name):
            continue
        start, end = entry["data_offsets"]
        chunks.append(data[start:end])
        kept[name] = dict(entry, data_offsets=[offset, offset + end - start])
        offset += end - start
    raw = json.dumps(kept).encode()
    target.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(chunks))
    return sum(1 for name in header if name != "__metadata__" and not keep(name))


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
