#!/usr/bin/env python3
"""Writes tests/fuzz/seeds/memory_index/index: the seed of fuzz_memory_index
that is an index file (its first byte 0; the harness appends the checksum)
in the layout of src/memory/search.h, of the harness's embedder (width 8,
identity "fuzz", word pooling): two articles of two chunks each."""
import struct
import sys


def lstr(b):
    return struct.pack('<I', len(b)) + b


def main(out):
    d = b'HMEMIDX\x00' + struct.pack('<IIII', 1, 8, 800, 0) + lstr(b'fuzz') + struct.pack('<I', 2)
    for slug, title in ((b'note', b'Note'), (b'gone', b'Gone')):
        d += lstr(slug) + struct.pack('<Q', 12345) + lstr(title) + struct.pack('<I', 2)
        for off, ln in ((20, 14), (0, 0)):
            d += struct.pack('<II', off, ln) + struct.pack('<8f', *([0.35355339] * 8))
    with open(out, 'wb') as f:
        f.write(b'\x00' + d)


if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else 'tests/fuzz/seeds/memory_index/index')
