#!/usr/bin/env python3
"""Writes the seed inputs of the safetensors fuzz target into
tests/fuzz/seeds/safetensors/: a few small good files and one of each kind of
bad file. Plain Python, no dependencies; rerunning gives the same bytes."""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fuzz", "seeds", "safetensors")


def st(header, data, hlen=None):
    h = header.encode()
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


SEEDS = {
    "good_f32": st('{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                   '"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}}', b"\0\0\x80?\0\0\0@\x80?\0@"),
    "dtypes": st('{"x":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"y":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[4,6]},'
                 '"z":{"dtype":"I64","shape":[],"data_offsets":[6,14]},"e":{"dtype":"U8","shape":[0],"data_offsets":[14,14]},'
                 '"w":{"dtype":"F64","shape":[1],"data_offsets":[14,22]}}', bytes(range(22))),
    "overlap": st('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}',
                  b"123456"),
    "truncated": st('{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', b"1234"),
    "badlen": st('{"a":1}', b"", hlen=1000),
    "dup": st('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
              b"12"),
}

if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
