"""Token shards of a data folder written by ``snip-data prepare``
(train.bin, val.bin; layout in include/snip/data/shard.h)."""

import json
import pathlib
import struct

import numpy as np
import torch

from .errors import Error

_MAGIC = b"SNIPTOK\x00"


def _header(p):
    """The 64-byte header of shard ``p``; snip.Error for an unreadable file or a bad magic."""
    try:
        with open(p, "rb") as f:
            head = f.read(64)
    except OSError as e:
        raise Error(f"{p}: cannot read ({e.strerror})") from None
    if len(head) < 64 or head[:8] != _MAGIC:
        raise Error(f"{p}: not a snip token shard (bad magic; expected 'SNIPTOK')")
    return head


def read_tokens(path):
    """The token ids of shard ``path`` as an int64 tensor [count] (memory-mapped
    read, one copy). Raises snip.Error naming the file for a missing file, a
    bad magic or version, a non-zero reserved byte, or a size that does not
    match the header's count."""
    p = pathlib.Path(path)
    head = _header(p)
    version, dtype, count, vocab = struct.unpack_from("<IIQI", head, 8)
    if version != 1 or dtype not in (1, 2) or any(head[28:64]):
        raise Error(f"{p}: unsupported shard (version {version}, dtype {dtype}) or corrupt header")
    width = 2 if dtype == 1 else 4
    if p.stat().st_size != 64 + count * width:
        raise Error(f"{p}: truncated: file is {p.stat().st_size} bytes, header promises {64 + count * width}")
    arr = np.memmap(p, dtype=np.uint16 if width == 2 else np.uint32, mode="r", offset=64, shape=(count,))
    return torch.from_numpy(arr.astype(np.int64))


def vocab_size(data_dir):
    """The vocabulary of data folder ``data_dir``: its train.bin header's
    vocab_size (tokens are in [0, vocab_size)). Raises snip.Error as read_tokens."""
    return struct.unpack_from("<I", _header(pathlib.Path(data_dir) / "train.bin"), 24)[0]
