"""A short, independent GGUF writer and reader (spec: ggml docs/gguf.md),
for the tests: no gguf package, no burnstore code.

Values are given typed: (vtype, value) with vtype one of the V* constants,
arrays as (VARRAY, (elem_vtype, [items])) where an item of a nested array is
itself (elem_vtype, [items]). The reader returns the same shape, so a file
read back compares equal to what was written.

Tensors: (name, ggml_type, shape_row_major, bytes). The writer reverses the
shape into GGUF's ne (fastest first), packs data with padding to the
alignment after every tensor, as ggml's gguf_write_to_file does.

Version 1 (llama.cpp's first GGUF files; docs/gguf.md's version history:
version 2 changed "most countable values (lengths, etc)" from uint32 to
uint64): the tensor and kv counts, string lengths, array lengths and the
dimensions ne[] are u32; n_dims, types and tensor offsets are as in version
3. Version 1 has no 64-bit value types (U64, I64, F64 came with version 2):
V1_TYPES lists those it has. Both writer and reader take version= / read it.

Run as a script: `gguf_fixture.py seeds DIR` writes the fuzz seed corpus.
"""
import struct
import sys

VU8, VI8, VU16, VI16, VU32, VI32, VF32, VBOOL, VSTRING, VARRAY, VU64, VI64, VF64 = range(13)
_SCALAR = {VU8: "<B", VI8: "<b", VU16: "<H", VI16: "<h", VU32: "<I", VI32: "<i", VF32: "<f",
           VBOOL: "<?", VU64: "<Q", VI64: "<q", VF64: "<d"}

# ggml type id -> (name, block elements, block bytes)
GGML = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
        6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
        10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
        13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
        16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
        19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
        22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
        24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
        28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
        34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17)}
TYPE_ID = {v[0]: k for k, v in GGML.items()}


def nbytes(gtype, shape):
    name, blck, size = GGML[gtype]
    n = 1
    for d in shape:
        n *= d
    assert shape and shape[-1] % blck == 0 or blck == 1
    return n // blck * size


V1_TYPES = {VU8, VI8, VU16, VI16, VU32, VI32, VF32, VBOOL, VSTRING, VARRAY}


def _size(n, version):
    """A count or length: u64, u32 in version 1."""
    return struct.pack("<I" if version == 1 else "<Q", n)


def _str(s, version=3):
    b = s.encode() if isinstance(s, str) else s
    return _size(len(b), version) + b


def _value(vt, v, version=3):
    if version == 1:
        assert vt in V1_TYPES, "version 1 has no value type %d" % vt
    if vt == VSTRING:
        return _str(v, version)
    if vt == VARRAY:
        et, items = v
        return struct.pack("<I", et) + _size(len(items), version) + b"".join(_value(et, x, version) for x in items)
    return struct.pack(_SCALAR[vt], v)


def write(path, kvs, tensors, version=3, alignment=None):
    """kvs: list of (key, vtype, value); tensors: list of (name, gtype, shape, bytes)."""
    align = alignment or 32
    for k, vt, v in kvs:
        if k == "general.alignment":
            align = v
    out = bytearray(b"GGUF" + struct.pack("<I", version) + _size(len(tensors), version) + _size(len(kvs), version))
    for k, vt, v in kvs:
        out += _str(k, version) + struct.pack("<I", vt) + _value(vt, v, version)
    off = 0
    offs = []
    for name, gt, shape, data in tensors:
        assert len(data) == nbytes(gt, shape), name
        offs.append(off)
        out += _str(name, version) + struct.pack("<I", len(shape))
        out += b"".join(_size(d, version) for d in reversed(shape))
        out += struct.pack("<IQ", gt, off)
        off += len(data)
        off += (-off) % align
    out += b"\0" * ((-len(out)) % align)
    for name, gt, shape, data in tensors:
        out += data + b"\0" * ((-len(data)) % align)
    with open(path, "wb") as f:
        f.write(out)
    return bytes(out)


class Reader:
    """Parse a GGUF file: .version, .kv (ordered dict key -> (vtype, value)),
    .tensors (ordered dict name -> dict(type, shape, offset, nbytes, data)),
    .alignment, .data_offset."""

    def __init__(self, path_or_bytes):
        if isinstance(path_or_bytes, (bytes, bytearray)):
            self.b = bytes(path_or_bytes)
        else:
            with open(path_or_bytes, "rb") as f:
                self.b = f.read()
        self.p = 0
        if self.b[:4] != b"GGUF":
            raise ValueError("no GGUF magic")
        self.version = struct.unpack_from("<I", self.b, 4)[0]
        if self.version not in (1, 2, 3):
            raise ValueError("GGUF version %d" % self.version)
        self.p = 8
        nt, nkv = self._size(), self._size()
        self.kv = {}
        self.kv_raw = {}
        for _ in range(nkv):
            k = self._string().decode()
            vt = self._u32()
            start = self.p
            self.kv[k] = (vt, self._value(vt))
            self.kv_raw[k] = self.b[start - 4:self.p]
        self.alignment = self.kv.get("general.alignment", (VU32, 32))[1]
        self.tensors = {}
        for _ in range(nt):
            name = self._string().decode()
            nd = self._u32()
            ne = [self._size() for _ in range(nd)]
            gt = self._u32()
            off = self._u64()
            self.tensors[name] = {"type": GGML[gt][0], "gtype": gt, "shape": list(reversed(ne)),
                                  "offset": off, "nbytes": nbytes(gt, list(reversed(ne)))}
        self.data_offset = self.p + (-self.p) % self.alignment
        for t in self.tensors.values():
            a = self.data_offset + t["offset"]
            t["data"] = self.b[a:a + t["nbytes"]]
            assert len(t["data"]) == t["nbytes"]

    def _u32(self):
        v = struct.unpack_from("<I", self.b, self.p)[0]
        self.p += 4
        return v

    def _u64(self):
        v = struct.unpack_from("<Q", self.b, self.p)[0]
        self.p += 8
        return v

    def _size(self):
        return self._u32() if self.version == 1 else self._u64()

    def _string(self):
        n = self._size()
        s = self.b[self.p:self.p + n]
        assert len(s) == n
        self.p += n
        return s

    def _value(self, vt):
        if vt == VSTRING:
            s = self._string()
            try:
                return s.decode()
            except UnicodeDecodeError:
                return s
        if vt == VARRAY:
            et = self._u32()
            n = self._size()
            return (et, [self._value(et) for _ in range(n)])
        fmt = _SCALAR[vt]
        v = struct.unpack_from(fmt, self.b, self.p)[0]
        self.p += struct.calcsize(fmt)
        return v


def every_type_kvs(name="tiny", template="{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"):
    """Metadata covering every value type, arrays of each, nested arrays."""
    return [
        ("general.architecture", VSTRING, "llama"),
        ("general.name", VSTRING, name),
        ("general.alignment", VU32, 32),
        ("t.u8", VU8, 255), ("t.i8", VI8, -128), ("t.u16", VU16, 65535), ("t.i16", VI16, -32768),
        ("t.u32", VU32, 4294967295), ("t.i32", VI32, -2147483648), ("t.f32", VF32, 0.5),
        ("t.bool", VBOOL, True), ("t.u64", VU64, 2**64 - 1), ("t.i64", VI64, -2**63),
        ("t.f64", VF64, 3.141592653589793),
        ("a.u8", VARRAY, (VU8, [0, 1, 255])), ("a.i8", VARRAY, (VI8, [-1, 2])),
        ("a.u16", VARRAY, (VU16, [7])), ("a.i16", VARRAY, (VI16, [-7, 8])),
        ("a.u32", VARRAY, (VU32, [1, 2, 3])), ("a.i32", VARRAY, (VI32, [-1, 0, 1])),
        ("a.f32", VARRAY, (VF32, [0.25, -1.5])), ("a.bool", VARRAY, (VBOOL, [True, False])),
        ("a.str", VARRAY, (VSTRING, ["a", "b\"c", "d\\e", "\u00e9\n"])),
        ("a.u64", VARRAY, (VU64, [2**64 - 1])), ("a.i64", VARRAY, (VI64, [-2**63])),
        ("a.f64", VARRAY, (VF64, [1e-300])), ("a.empty", VARRAY, (VI32, [])),
        ("a.nested", VARRAY, (VARRAY, [(VU8, [1, 2]), (VU8, [3])])),
        ("a.nested_str", VARRAY, (VARRAY, [(VSTRING, ["x", "y"])])),
        ("tokenizer.chat_template", VSTRING, template),
    ]


def q8_0_bytes(nblocks, seed=0):
    # d (f16) + 32 int8 per block
    out = bytearray()
    for b in range(nblocks):
        out += struct.pack("<e", 0.5 + b)
        out += bytes(((seed + b * 32 + i) * 7) % 256 for i in range(32))
    return bytes(out)


def q4_0_bytes(nblocks, seed=0):
    out = bytearray()
    for b in range(nblocks):
        out += struct.pack("<e", 0.25 * (b + 1))
        out += bytes(((seed + b * 16 + i) * 13) % 256 for i in range(16))
    return bytes(out)


def tiny_tensors():
    f32 = struct.pack("<6f", *[float(i) for i in range(6)])
    f16 = struct.pack("<4e", 1.0, -2.0, 0.5, 65504.0)
    return [
        ("token_embd.weight", TYPE_ID["F32"], [2, 3], f32),
        ("blk.0.attn_norm.weight", TYPE_ID["F16"], [4], f16),
        ("blk.0.attn_q.weight", TYPE_ID["Q8_0"], [2, 64], q8_0_bytes(4)),
        ("blk.0.ffn_down.weight", TYPE_ID["Q4_0"], [3, 32], q4_0_bytes(3, 5)),
        ("output.weight", TYPE_ID["I32"], [2], struct.pack("<2i", -1, 7)),
    ]


def write_tiny(path, **kw):
    return write(path, every_type_kvs(**kw), tiny_tensors())


def v1_kvs():
    """every_type_kvs less what version 1 has no type for."""
    def ok(vt, v):
        if vt == VARRAY:
            et, items = v
            return et in V1_TYPES and all(ok(et, x) for x in items) if et == VARRAY else et in V1_TYPES
        return vt in V1_TYPES
    return [(k, vt, v) for k, vt, v in every_type_kvs(name="v1") if ok(vt, v)]


def write_v1(path):
    """A version 1 file: every value type version 1 has, the tiny tensors."""
    return write(path, v1_kvs(), tiny_tensors(), version=1)


def seeds(d):
    import os
    os.makedirs(d, exist_ok=True)
    write_tiny(os.path.join(d, "tiny.gguf"))
    write(os.path.join(d, "v2_align64.gguf"), [("general.alignment", VU32, 64)],
          [("a", 0, [3], struct.pack("<3f", 1, 2, 3)), ("b.q", 8, [32], q8_0_bytes(1))], version=2)
    write(os.path.join(d, "empty.gguf"), [], [])
    write_v1(os.path.join(d, "v1.gguf"))
    write(os.path.join(d, "meta_only.gguf"),
          [("a.nested", VARRAY, (VARRAY, [(VARRAY, [(VSTRING, ["deep"])])]))], [])
    write(os.path.join(d, "kquant.gguf"), [("general.name", VSTRING, "k")],
          [("k4", 12, [256], bytes(144)), ("k6", 14, [2, 256], bytes(420))])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "seeds":
        seeds(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "tiny":
        write_tiny(sys.argv[2])
    else:
        sys.exit("usage: gguf_fixture.py seeds DIR | tiny FILE")
