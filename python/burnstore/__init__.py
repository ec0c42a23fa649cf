"""burnstore: model checkpoints as NumPy arrays, without a mount.

Burnpack (.bpk), SafeTensors and their shard sets, PyTorch (.pt/.pth, read
without unpickling), GGUF; local files, directories (a shard set) and URLs
(http://, https://, hf://ORG/REPO/PATH, s3://BUCKET/KEY, read by range
requests). A thin ctypes layer over libburnstore (include/burnstore.h,
docs/library.md): nothing compiled, nothing from a package index.

    import burnstore
    with burnstore.open("model.pth") as ck:        # or a URL, options="..."
        w = ck["encoder.layer.0.weight"]           # a numpy array
        ck.dtype("encoder.layer.0.weight")         # "BF16" (w is uint16 then)
        ck.metadata                                # {key: text}
    burnstore.save("out.safetensors", {"w": w}, metadata={"note": "hi"})

A tensor that is one contiguous range of a local file comes as a read-only
np.memmap of that file (no copy, nothing read until used); any other (a URL,
a strided PyTorch view, a decoded one, a deflated zip member) is read into a
fresh array. Types NumPy lacks come as the integers of their width, their
name from ck.dtype(key): BF16 as uint16, the 8-bit floats as uint8; the
sub-byte, ggml block and Burn QFloat types as uint8 rows of their bytes (the
last dimension in bytes, as gguf-py gives them). options="as=F32" decodes
every floating tensor to float32 as it is read.

The library is loaded by its SONAME (the python3-burnstore package depends
on the package holding it), or from $BURNSTORE_LIB (a path: a build tree's
libburnstore.so).
"""
import collections.abc
import ctypes
import errno
import json
import os

import numpy as np

__all__ = ["open", "save", "Checkpoint", "Tensor", "version"]

_SONAME = "libburnstore.so.0.2"  # (CMakeLists.txt checks it against the SOVERSION)

_c_size_p = ctypes.POINTER(ctypes.c_size_t)


def _load():
    lib = ctypes.CDLL(os.environ.get("BURNSTORE_LIB") or _SONAME)
    P, S, U64, I, C = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p
    sig = {
        "burnstore_init": (I, [ctypes.c_uint]),
        "burnstore_version": (C, []),
        "burnstore_version_num": (ctypes.c_uint, []),
        "burnstore_errcode": (I, []),
        "burnstore_errmsg": (C, []),
        "burnstore_dtype_name": (C, [I]),
        "burnstore_dtype_from_name": (I, [C, ctypes.POINTER(I)]),
        "burnstore_dtype_bits": (ctypes.c_uint, [I]),
        "burnstore_dtype_block": (ctypes.c_bool, [I, ctypes.POINTER(ctypes.c_uint32),
                                                  ctypes.POINTER(ctypes.c_uint32)]),
        "burnstore_open": (P, [C, C]),
        "burnstore_close": (None, [P]),
        "burnstore_source": (C, [P]),
        "burnstore_format": (C, [P]),
        "burnstore_count": (S, [P]),
        "burnstore_tensor_at": (P, [P, S]),
        "burnstore_meta_count": (S, [P]),
        "burnstore_meta_key": (C, [P, S]),
        "burnstore_meta_value": (I, [P, S, P, S, _c_size_p]),
        "burnstore_checkpoint_attr": (I, [P, C, P, S, _c_size_p]),
        "burnstore_checkpoint_attr_names": (I, [P, P, S, _c_size_p]),
        "burnstore_tensor_key": (C, [P]),
        "burnstore_tensor_dtype": (I, [P]),
        "burnstore_tensor_stored_dtype": (I, [P]),
        "burnstore_tensor_rank": (ctypes.c_uint, [P]),
        "burnstore_tensor_shape": (ctypes.POINTER(U64), [P]),
        "burnstore_tensor_nbytes": (U64, [P]),
        "burnstore_tensor_unreadable": (C, [P]),
        "burnstore_tensor_attr": (I, [P, C, P, S, _c_size_p]),
        "burnstore_tensor_attr_names": (I, [P, P, S, _c_size_p]),
        "burnstore_tensor_read": (I, [P, U64, P, S, _c_size_p]),
        "burnstore_tensor_file_range": (I, [P, ctypes.POINTER(C), ctypes.POINTER(U64)]),
        "burnstore_writer_new": (P, [C, C]),
        "burnstore_writer_free": (None, [P]),
        "burnstore_writer_format": (C, [P]),
        "burnstore_writer_add": (I, [P, C, I, ctypes.c_uint, ctypes.POINTER(U64), P, U64]),
        "burnstore_writer_add_tensor": (I, [P, C, P]),
        "burnstore_writer_add_checkpoint": (I, [P, P]),
        "burnstore_writer_set_meta": (I, [P, C, C]),
        "burnstore_writer_save": (I, [P]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    want = tuple(int(x) for x in _SONAME.rsplit(".so.", 1)[1].split("."))
    num = lib.burnstore_version_num()
    if (num >> 16, (num >> 8) & 0xFF) != want:
        raise ImportError("burnstore: %s is version %s, this module needs %d.%d" %
                          (lib._name, lib.burnstore_version().decode(), *want))
    # Once for the process; never undone (a checkpoint may outlive the
    # interpreter's own shutdown order).
    if lib.burnstore_init(0) != 0:
        raise ImportError("burnstore: %s" % lib.burnstore_errmsg().decode(errors="replace"))
    return lib


_lib = _load()


def version():
    """The library's version, "0.2.0"."""
    return _lib.burnstore_version().decode()


def _enc(s):
    """str -> bytes for the library (a key read from a file that is not
    UTF-8 comes back to its bytes: surrogateescape both ways)."""
    return s.encode("utf-8", "surrogateescape") if isinstance(s, str) else s


def _dec(b):
    return b.decode("utf-8", errors="surrogateescape") if b is not None else None


def _error(code=None):
    """The library's last failure on this thread as an OSError (its errno
    picks the subclass: FileNotFoundError, PermissionError...)."""
    c = _lib.burnstore_errcode() if code is None else code
    return OSError(c, _dec(_lib.burnstore_errmsg()))


def _check(rc):
    if rc != 0:
        raise _error(rc)


def _text(call, *args):
    """A value by the header's buffer rule: its length, then its bytes."""
    n = ctypes.c_size_t()
    _check(call(*args, None, 0, ctypes.byref(n)))
    buf = ctypes.create_string_buffer(n.value + 1)
    _check(call(*args, buf, n.value + 1, ctypes.byref(n)))
    return buf.raw[:n.value]


def _options(options, as_):
    """An option string: options as given (str), or items joined by commas
    (a comma in an item escaped), plus as=AS_."""
    if options is None:
        items = []
    elif isinstance(options, str):
        items = [options] if options else []
    else:
        items = [str(o).replace("\\", "\\\\").replace(",", "\\,") for o in options]
    if as_:
        items.append("as=%s" % as_)
    return ",".join(items) or None


# NumPy dtypes of burnstore's: the types NumPy has, and the raw integers of
# the width of those it lacks (BF16 as uint16, F8 as uint8).
_NP = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
       "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1",
       "BOOL": "?", "F8_E4M3": "u1", "F8_E5M2": "u1", "F8_E8M0": "u1", "F8_E4M3FNUZ": "u1",
       "F8_E5M2FNUZ": "u1", "C64": "<c8", "C128": "<c16", "FLEX32": "<f4", "BOOL_U8": "?",
       "BOOL_U32": "<u4", "QI8": "i1", "QU8": "u1", "QI32": "<i4"}
# And back, for save(): a NumPy array's dtype kind and size.
_FROM_NP = {("f", 8): "F64", ("f", 4): "F32", ("f", 2): "F16", ("i", 8): "I64", ("i", 4): "I32",
            ("i", 2): "I16", ("i", 1): "I8", ("u", 8): "U64", ("u", 4): "U32", ("u", 2): "U16",
            ("u", 1): "U8", ("b", 1): "BOOL", ("c", 8): "C64", ("c", 16): "C128"}


def _dtype_id(name):
    v = ctypes.c_int()
    _check(_lib.burnstore_dtype_from_name(_enc(name), ctypes.byref(v)))
    return v.value


def _np_view(name, shape, nbytes):
    """(numpy dtype, shape) of a tensor's bytes: its own, or for a type
    NumPy has no integer of its width for, uint8 rows of its bytes."""
    if name in _NP:
        return np.dtype(_NP[name]), shape
    # sub-byte, block and opaque types: the last dimension in bytes
    did = _dtype_id(name)
    bits = _lib.burnstore_dtype_bits(did)
    e, b = ctypes.c_uint32(), ctypes.c_uint32()
    row = None
    if shape and _lib.burnstore_dtype_block(did, ctypes.byref(e), ctypes.byref(b)):
        if shape[-1] % e.value == 0:
            row = shape[-1] // e.value * b.value
    elif shape and bits and shape[-1] * bits % 8 == 0:
        row = shape[-1] * bits // 8
    if row is not None and int(np.prod(shape[:-1], dtype=np.uint64)) * row == nbytes:
        return np.dtype("u1"), tuple(shape[:-1]) + (row,)
    return np.dtype("u1"), (nbytes,)


class Tensor:
    """A tensor to save() whose dtype NumPy cannot say: data (an array of
    its raw bytes or integers of its width: BF16 as uint16), dtype (its
    burnstore name, "BF16", "Q8_0"...) and shape (its elements'; None: the
    array's)."""

    __slots__ = ("data", "dtype", "shape")

    def __init__(self, data, dtype, shape=None):
        self.data, self.dtype, self.shape = data, dtype, shape


class _Ref:
    """A tensor of an open checkpoint, for save(): its bytes are streamed
    from there when saving (ck.ref(key))."""

    __slots__ = ("ck", "handle")

    def __init__(self, ck, handle):
        self.ck, self.handle = ck, handle


class Checkpoint(collections.abc.Mapping):
    """An open checkpoint: a read-only mapping of key -> numpy array, in the
    file's order (burnstore.open)."""

    def __init__(self, source, options=None, as_=None):
        self._h = None
        self.options = _options(options, as_)
        self._h = _lib.burnstore_open(_enc(os.fspath(source)), _enc(self.options))
        if not self._h:
            raise _error()
        n = _lib.burnstore_count(self._h)
        self._t = {}
        for i in range(n):
            t = _lib.burnstore_tensor_at(self._h, i)
            self._t[_dec(_lib.burnstore_tensor_key(t))] = t
        self._meta = None

    # ---- lifetime
    def close(self):
        """Close it; arrays already taken (memmaps too) stay valid."""
        if self._h:
            _lib.burnstore_close(self._h)
            self._h = None
            self._t = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _live(self):
        if not self._h:
            raise ValueError("burnstore: the checkpoint is closed")
        return self._h

    def _handle(self, key):
        self._live()
        try:
            return self._t[key]
        except KeyError:
            raise KeyError(key) from None

    # ---- the mapping
    def __len__(self):
        return len(self._t)

    def __iter__(self):
        return iter(list(self._t))

    def __contains__(self, key):
        return key in self._t

    def __getitem__(self, key):
        return self._array(self._handle(key))

    def __repr__(self):
        return "<burnstore.Checkpoint %s (%s, %d tensors)%s>" % (
            self.source if self._h else "?", self.format if self._h else "closed", len(self),
            "" if self._h else " closed")

    # ---- what the checkpoint says
    @property
    def source(self):
        """The path (a directory's: its index) or the URL (without secrets)."""
        return _dec(_lib.burnstore_source(self._live()))

    @property
    def format(self):
        """"burnpack", "safetensors", "safetensors-sharded", "pytorch" or "gguf"."""
        return _dec(_lib.burnstore_format(self._live()))

    @property
    def metadata(self):
        """The file's metadata as {key: text} (a GGUF value made text)."""
        if self._meta is None:
            self._live()
            m = {}
            for i in range(_lib.burnstore_meta_count(self._h)):
                k = _dec(_lib.burnstore_meta_key(self._h, i))
                m[k] = _dec(_text(_lib.burnstore_meta_value, self._h, i))
            self._meta = m
        return dict(self._meta)

    def _root(self, name):
        try:
            return _dec(_text(_lib.burnstore_checkpoint_attr, self._live(), _enc(name)))
        except OSError as e:
            if e.errno == errno.ENODATA:
                return None
            raise

    @property
    def notes(self):
        """What the reader skipped (a line each), or None."""
        return self._root("notes")

    @property
    def values(self):
        """A PyTorch file's non-tensor values (parsed from JSON), or None."""
        v = self._root("values")
        return json.loads(v) if v is not None else None

    # ---- a tensor
    def dtype(self, key):
        """Its dtype's burnstore name ("F32", "BF16", "Q4_0"...): as read,
        so with as_="F32" the decoded one."""
        return _dec(_lib.burnstore_dtype_name(_lib.burnstore_tensor_dtype(self._handle(key))))

    def stored_dtype(self, key):
        """The dtype in the file (differs from dtype() when decoded)."""
        return _dec(_lib.burnstore_dtype_name(
            _lib.burnstore_tensor_stored_dtype(self._handle(key))))

    def shape(self, key):
        t = self._handle(key)
        r = _lib.burnstore_tensor_rank(t)
        s = _lib.burnstore_tensor_shape(t)
        return tuple(int(s[i]) for i in range(r))

    def nbytes(self, key):
        return int(_lib.burnstore_tensor_nbytes(self._handle(key)))

    def attrs(self, key):
        """What a mount shows as user.burnstore.NAME on the tensor's file:
        {NAME: text} (dtype, shape, key, param_id, shard, stored_dtype)."""
        t = self._handle(key)
        names = _text(_lib.burnstore_tensor_attr_names, t).split(b"\0")
        return {_dec(n): _dec(_text(_lib.burnstore_tensor_attr, t, n)) for n in names if n}

    def file_range(self, key):
        """(path, offset) of its bytes when they are one range of a local
        file (what a memmap maps), else None."""
        t = self._handle(key)
        p, o = ctypes.c_char_p(), ctypes.c_uint64()
        if _lib.burnstore_tensor_file_range(t, ctypes.byref(p), ctypes.byref(o)) != 0:
            return None
        return _dec(p.value), o.value

    def read(self, key, offset=0, size=None):
        """Bytes [offset, offset + size) of its data (as read), as bytes."""
        t = self._handle(key)
        total = int(_lib.burnstore_tensor_nbytes(t))
        n = max(0, min(total - offset, size if size is not None else total))
        buf = ctypes.create_string_buffer(n or 1)
        got = ctypes.c_size_t()
        _check(_lib.burnstore_tensor_read(t, offset, buf, n, ctypes.byref(got)))
        return buf.raw[:got.value]

    def ref(self, key):
        """The tensor for save(), streamed from here (nothing read now)."""
        return _Ref(self, self._handle(key))

    def _array(self, t):
        why = _lib.burnstore_tensor_unreadable(t)
        if why is not None:
            raise OSError(errno.ENOTSUP, "%s: tensor '%s' cannot be read: %s" % (
                self.source, _dec(_lib.burnstore_tensor_key(t)), _dec(why)))
        name = _dec(_lib.burnstore_dtype_name(_lib.burnstore_tensor_dtype(t)))
        r = _lib.burnstore_tensor_rank(t)
        s = _lib.burnstore_tensor_shape(t)
        shape = tuple(int(s[i]) for i in range(r))
        nbytes = int(_lib.burnstore_tensor_nbytes(t))
        dt, shape = _np_view(name, shape, nbytes)
        p, o = ctypes.c_char_p(), ctypes.c_uint64()
        if nbytes and _lib.burnstore_tensor_file_range(t, ctypes.byref(p), ctypes.byref(o)) == 0:
            return np.memmap(_dec(p.value), dtype=dt, mode="r", offset=o.value, shape=shape)
        a = np.empty(nbytes, dtype=np.uint8)
        got = ctypes.c_size_t()
        _check(_lib.burnstore_tensor_read(t, 0, a.ctypes.data, nbytes, ctypes.byref(got)))
        if got.value != nbytes:
            raise OSError(errno.EIO, "%s: tensor '%s': %d of %d bytes read" % (
                self.source, _dec(_lib.burnstore_tensor_key(t)), got.value, nbytes))
        return a.view(dt).reshape(shape)


def open(source, options=None, as_=None):  # noqa: A001 (burnstore.open, as io.open)
    """Open a checkpoint: a file, a directory (its shard set's index) or a
    URL. options: the mount's options for what is read (a string,
    "include=REGEX,remap=FROM=>TO,adapter=pytorch,http_cache=256M,...", or a
    list of items); as_="F32" (or "F16", "BF16"): floating tensors decoded
    to it. Raises OSError (its errno: FileNotFoundError, ...) with the
    library's one-line message."""
    return Checkpoint(source, options, as_)


def save(path, tensors, metadata=None, options=None):
    """Write a checkpoint in the format path's extension names (.bpk,
    .safetensors, .safetensors.index.json, .gguf, .pth/.pt), atomically.
    tensors: a Checkpoint (everything in it, with its metadata: what
    `burnstore convert` does) or a mapping of key -> numpy array (any byte
    order, made contiguous), Tensor (a dtype NumPy lacks) or ck.ref(key) (a
    tensor of an open checkpoint, streamed). metadata: {key: text}, set
    after a Checkpoint's (a .pth has no place for metadata: ValueError).
    options: "max_shard_size=2GB" (a SafeTensors shard set)."""
    w = _lib.burnstore_writer_new(_enc(os.fspath(path)), _enc(_options(options, None)))
    if not w:
        raise _error()
    keep = []  # what the writer borrows until it is saved
    try:
        if isinstance(tensors, Checkpoint):
            keep.append(tensors)
            _check(_lib.burnstore_writer_add_checkpoint(w, tensors._live()))
        else:
            for key, v in tensors.items():
                _add(w, key, v, keep)
        for k, v in (metadata or {}).items():
            rc = _lib.burnstore_writer_set_meta(w, _enc(k), _enc(v))
            if rc == errno.ENOTSUP:  # the format has no place for metadata
                raise ValueError(_dec(_lib.burnstore_errmsg()))
            _check(rc)
        _check(_lib.burnstore_writer_save(w))
    finally:
        _lib.burnstore_writer_free(w)


def _le_contiguous(v):
    """v as a C-contiguous little-endian array (a 0-d one stays 0-d)."""
    a = np.asarray(v)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _add(w, key, v, keep):
    if isinstance(v, _Ref):
        v.ck._live()
        keep.append(v.ck)
        _check(_lib.burnstore_writer_add_tensor(w, _enc(key), v.handle))
        return
    a = _le_contiguous(v.data if isinstance(v, Tensor) else v)
    if isinstance(v, Tensor):
        name, shape = v.dtype, tuple(a.shape if v.shape is None else v.shape)
    else:
        name = _FROM_NP.get((a.dtype.kind, a.dtype.itemsize))
        if name is None:
            raise TypeError("burnstore.save: tensor '%s': numpy dtype %s has no burnstore dtype "
                            "(give a burnstore.Tensor naming one)" % (key, a.dtype))
        shape = a.shape
    keep.append(a)
    dims = (ctypes.c_uint64 * max(len(shape), 1))(*shape)
    _check(_lib.burnstore_writer_add(w, _enc(key), _dtype_id(name), len(shape),
                                     dims if shape else None, a.ctypes.data if a.nbytes else None,
                                     a.nbytes))
