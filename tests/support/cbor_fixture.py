"""A short, independent CBOR (RFC 8949) encoder for the tests and the
benchmark: what a Burnpack's metadata needs (definite lengths, shortest
heads; None, bool, ints, str, bytes, list, dict in its own order). No
burnstore code; tests/e2e/bsmount.py's cbor_decode reads it back."""


def cbor_encode(v):
    def head(major, n):
        if n < 24:
            return bytes([major << 5 | n])
        for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
            if n < 1 << (8 * size):
                return bytes([major << 5 | info]) + n.to_bytes(size, "big")
        raise ValueError("CBOR head of %d" % n)
    if isinstance(v, bool) or v is None:
        return bytes([0xf5 if v is True else 0xf4 if v is False else 0xf6])
    if isinstance(v, int):
        return head(0, v) if v >= 0 else head(1, -1 - v)
    if isinstance(v, str):
        b = v.encode()
        return head(3, len(b)) + b
    if isinstance(v, bytes):
        return head(2, len(v)) + v
    if isinstance(v, list):
        return head(4, len(v)) + b"".join(cbor_encode(x) for x in v)
    if isinstance(v, dict):
        return head(5, len(v)) + b"".join(cbor_encode(k) + cbor_encode(x) for k, x in v.items())
    raise TypeError(type(v))
