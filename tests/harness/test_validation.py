"""Every public function refuses bad input with an error that names the argument.

For each function a valid call is written once; each case breaks one argument and expects
ValueError (wrong ndim, shapes that do not match, NaN, +inf, a non-positive size) or TypeError
(a non-float dtype, a size that is not an int) whose message contains that argument's name.
"""

from __future__ import annotations

import numpy as np
import pytest

from course_utils import (
    attention_reference,
    flash_attention_forward,
    merge_partials,
    online_softmax_stats,
    online_softmax_steps,
    split_kv_decode,
    split_kv_partials,
)

pytestmark = pytest.mark.filterwarnings("error")

RNG = np.random.default_rng(0)
Q, K, V = RNG.normal(size=(4, 3)), RNG.normal(size=(5, 3)), RNG.normal(size=(5, 2))

# name -> (function, valid keyword arguments, array arguments that may hold -inf, int arguments)
FUNCTIONS = {
    "online_softmax_stats": (
        online_softmax_stats,
        {"x": RNG.normal(size=(2, 6)), "block": 2},
        {"x"},
        ("block",),
    ),
    "online_softmax_steps": (
        online_softmax_steps,
        {"x": RNG.normal(size=6), "v": RNG.normal(size=(6, 2)), "block": 2},
        {"x"},
        ("block",),
    ),
    "merge_partials": (
        merge_partials,
        {
            "o1": RNG.normal(size=(3, 2)),
            "lse1": RNG.normal(size=3),
            "o2": RNG.normal(size=(3, 2)),
            "lse2": RNG.normal(size=3),
        },
        {"lse1", "lse2"},
        (),
    ),
    "attention_reference": (attention_reference, {"Q": Q, "K": K, "V": V}, set(), ()),
    "flash_attention_forward": (
        flash_attention_forward,
        {"Q": Q, "K": K, "V": V, "Br": 2, "Bc": 2},
        set(),
        ("Br", "Bc"),
    ),
    "split_kv_partials": (
        split_kv_partials,
        {"q": Q[0], "K": K, "V": V, "num_splits": 2},
        set(),
        ("num_splits",),
    ),
    "split_kv_decode": (
        split_kv_decode,
        {"q": Q, "K": K, "V": V, "num_splits": 2},
        set(),
        ("num_splits",),
    ),
}
ATTENTION = ["attention_reference", "flash_attention_forward"]
DECODE = ["split_kv_partials", "split_kv_decode"]


def call(fname, **changes):
    fn, kwargs, _, _ = FUNCTIONS[fname]
    return fn(**{**kwargs, **changes})


def names(arg):
    """A regex that finds the argument's name as a word in the message."""
    return rf"\b{arg}\b"


def array_args():
    for fname, (_, kwargs, may_be_neg_inf, _) in FUNCTIONS.items():
        for arg, value in kwargs.items():
            if isinstance(value, np.ndarray):
                yield fname, arg, value, arg in may_be_neg_inf


ARRAY_ARGS = list(array_args())
ARRAY_IDS = [f"{f}-{a}" for f, a, _, _ in ARRAY_ARGS]
INT_ARGS = [(f, a) for f, (_, _, _, ints) in FUNCTIONS.items() for a in ints]


@pytest.mark.parametrize("fname", list(FUNCTIONS))
def test_the_valid_calls_work(fname):
    # the base of every case below: only the broken argument can be to blame
    result = call(fname)
    assert result is not None


@pytest.mark.parametrize(("fname", "arg", "good", "neg_inf_ok"), ARRAY_ARGS, ids=ARRAY_IDS)
@pytest.mark.parametrize(
    "make_bad",
    [
        lambda a: np.round(a).astype(np.int64),
        lambda a: a > 0,
        lambda a: a.astype(np.complex128),
        lambda a: a.astype(object),
        lambda a: np.full(a.shape, "1.0"),
    ],
    ids=["int", "bool", "complex", "object", "str"],
)
def test_non_float_dtypes_are_refused(fname, arg, good, neg_inf_ok, make_bad):
    with pytest.raises(TypeError, match=names(arg)):
        call(fname, **{arg: make_bad(good)})


@pytest.mark.parametrize(("fname", "arg", "good", "neg_inf_ok"), ARRAY_ARGS, ids=ARRAY_IDS)
def test_python_int_lists_are_refused(fname, arg, good, neg_inf_ok):
    with pytest.raises(TypeError, match=names(arg)):
        call(fname, **{arg: np.round(good).astype(int).tolist()})


@pytest.mark.parametrize(("fname", "arg", "good", "neg_inf_ok"), ARRAY_ARGS, ids=ARRAY_IDS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_dtypes_and_lists_are_accepted(fname, arg, good, neg_inf_ok, dtype):
    out = call(fname, **{arg: good.astype(dtype)})
    from_list = call(fname, **{arg: good.tolist()})
    reference = call(fname)
    for a, b, c in zip(_arrays(out), _arrays(from_list), _arrays(reference), strict=True):
        assert a.dtype == np.float64
        np.testing.assert_array_equal(b, c)


def _arrays(result):
    """The arrays in a result: a tuple of arrays, or the steps of online_softmax_steps."""
    if isinstance(result, list):
        return [np.asarray(s.acc) for s in result] + [np.asarray(s.l) for s in result]
    return list(result)


@pytest.mark.parametrize(("fname", "arg", "good", "neg_inf_ok"), ARRAY_ARGS, ids=ARRAY_IDS)
@pytest.mark.parametrize("where", [0, -1])
def test_nan_is_refused(fname, arg, good, neg_inf_ok, where):
    bad = good.copy()
    bad.flat[where] = np.nan
    with pytest.raises(ValueError, match=names(arg)):
        call(fname, **{arg: bad})


@pytest.mark.parametrize(("fname", "arg", "good", "neg_inf_ok"), ARRAY_ARGS, ids=ARRAY_IDS)
def test_plus_inf_is_refused(fname, arg, good, neg_inf_ok):
    bad = good.copy()
    bad.flat[-1] = np.inf
    with pytest.raises(ValueError, match=names(arg)):
        call(fname, **{arg: bad})


@pytest.mark.parametrize(("fname", "arg", "good", "neg_inf_ok"), ARRAY_ARGS, ids=ARRAY_IDS)
def test_minus_inf_only_where_it_means_masked(fname, arg, good, neg_inf_ok):
    # -inf is a masked score (x) or an empty set (lse); in values, queries and keys it is an error
    bad = good.copy()
    bad.flat[0] = -np.inf
    if neg_inf_ok:
        call(fname, **{arg: bad})
    else:
        with pytest.raises(ValueError, match=names(arg)):
            call(fname, **{arg: bad})


WRONG_NDIM = [
    ("online_softmax_stats", "x", np.float64(1.0)),
    ("online_softmax_steps", "x", np.zeros((2, 6))),
    ("online_softmax_steps", "x", np.float64(1.0)),
    ("online_softmax_steps", "v", np.zeros((6, 2, 1))),
    ("online_softmax_steps", "v", np.float64(1.0)),
    *[(f, "Q", Q[0]) for f in ATTENTION],
    *[(f, "Q", Q[None]) for f in ATTENTION],
    *[(f, "K", K[0]) for f in ATTENTION + DECODE],
    *[(f, "K", K[None]) for f in ATTENTION + DECODE],
    *[(f, "V", V[:, 0]) for f in ATTENTION + DECODE],
    *[(f, "V", V[None]) for f in ATTENTION + DECODE],
    *[(f, "q", np.float64(1.0)) for f in DECODE],
    *[(f, "q", Q[None]) for f in DECODE],
]


@pytest.mark.parametrize(
    ("fname", "arg", "bad"),
    WRONG_NDIM,
    ids=[f"{f}-{a}-{np.ndim(b)}d" for f, a, b in WRONG_NDIM],
)
def test_wrong_ndim_is_refused(fname, arg, bad):
    with pytest.raises(ValueError, match=names(arg)):
        call(fname, **{arg: bad})


@pytest.mark.parametrize(("fname", "arg"), INT_ARGS)
@pytest.mark.parametrize("bad", [0, -1, -16])
def test_non_positive_sizes_are_refused(fname, arg, bad):
    with pytest.raises(ValueError, match=names(arg)):
        call(fname, **{arg: bad})


@pytest.mark.parametrize(("fname", "arg"), INT_ARGS)
@pytest.mark.parametrize("bad", [2.5, 2.0, True, False, "2", None, np.float64(2.0)], ids=repr)
def test_non_integer_sizes_are_refused(fname, arg, bad):
    with pytest.raises(TypeError, match=names(arg)):
        call(fname, **{arg: bad})


@pytest.mark.parametrize(("fname", "arg"), INT_ARGS)
@pytest.mark.parametrize("good", [1, 3, np.int64(2), np.int32(7), 1000])
def test_integer_sizes_of_any_int_type_are_accepted(fname, arg, good):
    # sizes larger than the input are fine too (one block, or empty splits)
    np.testing.assert_equal(
        _arrays(call(fname, **{arg: good})), _arrays(call(fname, **{arg: int(good)}))
    )


# --- shapes that do not fit together --------------------------------------------------------


@pytest.mark.parametrize("fname", ATTENTION)
@pytest.mark.parametrize("arg", ["Q", "K"])
def test_q_and_k_head_dim_mismatch(fname, arg):
    bad = {"Q": Q[:, :2], "K": K[:, :2]}[arg]
    with pytest.raises(ValueError, match=r"\bQ\b") as info:
        call(fname, **{arg: bad})
    assert "K" in str(info.value)


@pytest.mark.parametrize("fname", DECODE)
@pytest.mark.parametrize("q", [Q[0, :2], Q[:, :2]], ids=["q1d", "q2d"])
def test_decode_q_and_k_head_dim_mismatch(fname, q):
    # the argument is called q: a learner who passed q of shape (2,) must find q and (2,) in the
    # message, not a Q of a shape they never made
    with pytest.raises(ValueError, match=r"\bq\b") as info:
        call(fname, q=q)
    assert "K" in str(info.value)
    assert str(q.shape) in str(info.value)


@pytest.mark.parametrize("fname", ATTENTION + DECODE)
@pytest.mark.parametrize("which", ["K", "V"])
def test_k_and_v_length_mismatch(fname, which):
    bad = {"K": K[:4], "V": V[:4]}[which]
    with pytest.raises(ValueError, match=r"\bK\b.*\bV\b"):
        call(fname, **{which: bad})


def test_steps_one_value_per_score():
    with pytest.raises(ValueError, match=names("v")):
        online_softmax_steps(np.zeros(6), np.zeros((5, 2)), 2)
    with pytest.raises(ValueError, match=names("v")):
        online_softmax_steps(np.zeros(6), np.zeros(7), 2)


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"lse2": np.zeros(4)}, r"\blse1\b.*\blse2\b"),
        ({"lse1": np.zeros(4)}, r"\blse1\b.*\blse2\b"),
        ({"lse2": np.zeros((3, 1))}, r"\blse1\b.*\blse2\b"),
        ({"o2": np.zeros((3, 3))}, r"\bo1\b.*\bo2\b"),
        ({"o1": np.zeros((4, 2))}, r"\bo1\b.*\bo2\b"),
        ({"o2": np.zeros(3)}, r"\bo1\b.*\bo2\b"),
        ({"o1": np.zeros((4, 2)), "o2": np.zeros((4, 2))}, r"\bo1\b.*\blse1\b"),
        ({"o1": np.zeros((2, 3)), "o2": np.zeros((2, 3))}, r"\bo1\b.*\blse1\b"),
        ({"o1": np.zeros((3, 2, 2)), "o2": np.zeros((3, 2, 2))}, r"\bo1\b.*\blse1\b"),
        ({"o1": np.zeros(()), "o2": np.zeros(())}, r"\bo1\b.*\blse1\b"),
    ],
    ids=lambda p: "" if isinstance(p, str) else "-".join(f"{k}{v.shape}" for k, v in p.items()),
)
def test_merge_shape_mismatch(changes, pattern):
    with pytest.raises(ValueError, match=pattern):
        call("merge_partials", **changes)


# --- causal and softmax_scale ---------------------------------------------------------------


@pytest.mark.parametrize("fname", ATTENTION)
def test_causal_needs_as_many_queries_as_keys(fname):
    with pytest.raises(ValueError, match="causal"):
        call(fname, causal=True)  # Q has 4 rows, K has 5


@pytest.mark.parametrize("fname", ATTENTION)
@pytest.mark.parametrize("bad", [1, 0, "yes", None, 1.0], ids=repr)
def test_causal_must_be_a_bool(fname, bad):
    with pytest.raises(TypeError, match="causal"):
        call(fname, K=K[:4], V=V[:4], causal=bad)


@pytest.mark.parametrize("fname", ATTENTION)
def test_causal_accepts_numpy_bool(fname):
    call(fname, K=K[:4], V=V[:4], causal=np.bool_(True))


@pytest.mark.parametrize("fname", ATTENTION + DECODE)
@pytest.mark.parametrize("bad", [0.0, -1.0, -0.5, np.nan, np.inf, -np.inf], ids=repr)
def test_softmax_scale_must_be_positive_and_finite(fname, bad):
    with pytest.raises(ValueError, match="softmax_scale"):
        call(fname, softmax_scale=bad)


@pytest.mark.parametrize("fname", ATTENTION + DECODE)
@pytest.mark.parametrize("bad", ["0.5", True, 1j, [0.5]], ids=repr)
def test_softmax_scale_must_be_a_real_number(fname, bad):
    with pytest.raises(TypeError, match="softmax_scale"):
        call(fname, softmax_scale=bad)


@pytest.mark.parametrize("fname", ATTENTION + DECODE)
@pytest.mark.parametrize("good", [0.5, 2, np.float32(0.25)], ids=repr)
def test_softmax_scale_accepts_real_numbers(fname, good):
    out = call(fname, softmax_scale=good)
    assert all(np.isfinite(a).all() for a in out)
