"""snip's element and scale codecs against ml_dtypes (jax-ml/ml_dtypes, the
reference implementation JAX, TensorFlow and torchao's tests use).

For E4M3, E5M2, E2M1, E2M3, E3M2: every code decodes to ml_dtypes' value;
RNE encoding of a sweep (every representable value, every midpoint between
neighbours -- the ties --, each midpoint's float32 neighbours, the subnormal
range, overflow, +-0, +-Inf, NaN, random values over the whole range) gives
ml_dtypes' code. E8M0: every code decodes to ml_dtypes' float8_e8m0fnu
value, and the code of 2^k is ml_dtypes' code of 2^k.

By design, snip's default encode *saturates* (saturate = true: a finite value
beyond the largest finite value, and +-Inf in a format without Inf, becomes
+-max), as the OCP Microscaling Formats (MX) v1.0 specification, section
5.3 ("Conversion from FP32 ... implementations should saturate to the
maximum normal"), TransformerEngine's casts and CUDA's `cvt.rn.satfinite`
do, while ml_dtypes converts IEEE-style where the format has Inf or NaN
(overflow to Inf in E5M2, to NaN in E4M3) and saturates where it has
neither (E2M1, E2M3, E3M2). So the comparison is exact against saturate =
false, and against saturate = true it is exact except on E4M3/E5M2
overflow, where the rule above is checked value by value.
"""
import subprocess

import ml_dtypes
import numpy as np
import pytest

# snip format -> (ml_dtypes type, bits, has_inf, has_nan)
FORMATS = {
    "e4m3": (ml_dtypes.float8_e4m3fn, 8, False, True),
    "e5m2": (ml_dtypes.float8_e5m2, 8, True, True),
    "e2m1": (ml_dtypes.float4_e2m1fn, 4, False, False),
    "e2m3": (ml_dtypes.float6_e2m3fn, 6, False, False),
    "e3m2": (ml_dtypes.float6_e3m2fn, 6, False, False),
}


def run(codec_dump, *args, stdin=b""):
    p = subprocess.run([codec_dump, *args], input=stdin, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout


def snip_decode(codec_dump, name):
    return np.frombuffer(run(codec_dump, "decode", name), dtype=np.float32)


def snip_encode(codec_dump, name, x, saturate):
    out = run(codec_dump, "encode", name, "1" if saturate else "0", stdin=x.astype("<f4").tobytes())
    return np.frombuffer(out, dtype=np.uint16).astype(np.uint8)


def ml_codes(t, x):
    return x.astype(np.float32).astype(t).view(np.uint8)


def sweep(t):
    """float32 inputs that exercise every rounding case of format t."""
    n = {ml_dtypes.float4_e2m1fn: 16, ml_dtypes.float6_e2m3fn: 64, ml_dtypes.float6_e3m2fn: 64}.get(t, 256)
    vals = np.arange(n, dtype=np.uint8).view(t).astype(np.float32)
    fin = np.unique(vals[np.isfinite(vals)])
    mids = (fin[:-1].astype(np.float64) + fin[1:]) / 2          # ties: exact in float32
    mids = mids.astype(np.float32)
    up = np.nextafter(mids, np.float32(np.inf))
    down = np.nextafter(mids, np.float32(-np.inf))
    mx = float(np.max(fin))
    tiny = float(np.min(fin[fin > 0]))
    rng = np.random.default_rng(0)
    rand = (rng.standard_normal(20000) * mx / 3).astype(np.float32)
    logu = np.exp2(rng.uniform(np.log2(tiny) - 3, np.log2(mx) + 2, 20000)).astype(np.float32)
    special = np.array([0.0, -0.0, tiny / 2, -tiny / 2, tiny / 4, tiny * 0.75, mx, mx * 1.01, mx * 1.5, mx * 4,
                        1e30, -1e30, np.float32(3.4e38), np.inf, -np.inf, np.nan], dtype=np.float32)
    return np.concatenate([vals[np.isfinite(vals)], mids, up, down, rand, logu, -logu, special]), mx


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_code_decodes_as_ml_dtypes(codec_dump, name):
    t, bits, _, _ = FORMATS[name]
    ours = snip_decode(codec_dump, name)
    assert ours.size == 2 ** bits
    ref = np.arange(2 ** bits, dtype=np.uint8).view(t).astype(np.float32)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    # bit-equal, so -0.0 vs +0.0 counts too
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), ref[~nan].view(np.uint32))


@pytest.mark.parametrize("name", list(FORMATS))
def test_rne_encode_equals_ml_dtypes_without_saturation(codec_dump, name):
    t, _, _, _ = FORMATS[name]
    x, _ = sweep(t)
    ours = snip_encode(codec_dump, name, x, saturate=False)
    ref = ml_codes(t, x)
    bad = np.nonzero(ours != ref)[0]
    assert bad.size == 0, [(float(x[i]), int(ours[i]), int(ref[i])) for i in bad[:10]]


@pytest.mark.parametrize("name", list(FORMATS))
def test_saturating_encode_differs_only_by_the_saturation_rule(codec_dump, name):
    t, bits, has_inf, _ = FORMATS[name]
    x, mx = sweep(t)
    ours = snip_encode(codec_dump, name, x, saturate=True)
    ref = ml_codes(t, x)
    dec = np.arange(2 ** bits, dtype=np.uint8).view(t).astype(np.float32)
    ref_val = dec[ref]
    # Where ml_dtypes' result is finite, snip's code is the same.
    finite = np.isfinite(ref_val) | np.isnan(x)
    same = ours == ref
    assert same[finite & ~np.isnan(x)].all()
    # Where ml_dtypes overflows (Inf, or NaN for a finite or infinite input in
    # E4M3), snip gives +-max; +-Inf input stays +-Inf where the format has Inf.
    over = ~finite
    ours_val = dec[ours]
    for xi, v in zip(x[over], ours_val[over]):
        if np.isinf(xi) and has_inf:
            assert v == xi
        else:
            assert v == np.copysign(mx, xi), (float(xi), float(v))
    if FORMATS[name][3] or has_inf:
        assert over.sum() > 0, "the sweep reaches no overflow"
    else:
        # FP4/FP6 have neither Inf nor NaN: ml_dtypes saturates too, so the
        # two agree on every input (including overflow and +-Inf).
        assert over.sum() == 0 and (ours[~np.isnan(x)] == ref[~np.isnan(x)]).all()
    # NaN input: the format's NaN (E4M3, E5M2) like ml_dtypes; formats without
    # NaN give the negative-zero code as ml_dtypes does.
    nan_in = np.isnan(x)
    assert (ours[nan_in] == ref[nan_in]).all()


def test_e8m0_scales_equal_ml_dtypes(codec_dump):
    ours = np.frombuffer(run(codec_dump, "e8m0"), dtype=np.float32)
    ref = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_array_equal(ours[ok].view(np.uint32), ref[ok].view(np.uint32))
    # The code of 2^k for every k E8M0 represents: ml_dtypes' code of the value 2^k.
    k = np.arange(-127, 128, dtype=np.int32)
    codes = np.frombuffer(run(codec_dump, "e8m0-exp", stdin=k.astype("<i4").tobytes()), dtype=np.uint8)
    ref_codes = np.exp2(k.astype(np.float64)).astype(np.float32).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    np.testing.assert_array_equal(codes, ref_codes)
