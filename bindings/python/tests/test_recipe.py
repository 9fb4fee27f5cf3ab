import pickle

import pytest

import libte


def test_defaults_follow_te():
    r = libte.Recipe()
    assert r.kind == "delayed"
    assert r.fp8_format == "HYBRID"
    assert r.margin == 0
    assert r.amax_history_len == 1024
    assert r.amax_compute_algo == "max"
    assert r.reduce_amax is True
    assert r.power_2_scale is False
    assert r.amax_epsilon == 0.0
    assert (r.fprop_split_accumulator, r.dgrad_split_accumulator,
            r.wgrad_split_accumulator) == (False, True, True)
    assert r.describe.startswith("delayed_scaling(")


def test_block_scaling_defaults_to_power_of_2_and_e4m3():
    r = libte.Recipe(kind="block")
    assert r.power_2_scale is True and r.power_of_2_scales is True
    assert r.fp8_format == "E4M3"


def test_equal_options_equal_keys():
    a = libte.Recipe(kind="delayed", margin=1, amax_history_len=16)
    b = libte.Recipe(margin=1, amax_history_len=16, amax_compute_algo="max")
    c = libte.Recipe(margin=2, amax_history_len=16)
    assert a.key == b.key and a == b and hash(a) == hash(b)
    assert a.key != c.key and a != c
    assert a.key != 0
    assert a.describe == b.describe != c.describe


def test_every_field_changes_the_key():
    base = libte.Recipe(kind="current")
    variants = [dict(fp8_format="E4M3"), dict(power_2_scale=True), dict(amax_epsilon=1e-3),
                dict(fprop_split_accumulator=True), dict(dgrad_split_accumulator=False),
                dict(wgrad_split_accumulator=False), dict(reduce_amax=False)]
    keys = {base.key}
    for v in variants:
        keys.add(libte.Recipe(kind="current", **v).key)
    assert len(keys) == len(variants) + 1


def test_te_enum_like_values_and_aliases():
    class Format:
        name = "E4M3"
    r = libte.Recipe(kind="current", fp8_format=Format(), power_of_2_scales=True)
    assert r.fp8_format == "E4M3" and r.power_2_scale
    assert libte.Recipe(amax_compute_algo="most_recent").amax_compute_algo == "most_recent"


def test_options_round_trip_and_pickle():
    r = libte.Recipe(kind="delayed", margin=3, amax_history_len=7,
                     amax_compute_algo="most_recent")
    assert libte.Recipe(**r.options()) == r
    assert pickle.loads(pickle.dumps(r)).key == r.key


@pytest.mark.parametrize("kwargs, text", [
    (dict(kind="sometimes"), "argument 'kind'"),
    (dict(fp8_format="E5M2"), "argument 'fp8_format'"),
    (dict(amax_compute_algo="mean"), "argument 'amax_compute_algo'"),
    (dict(margin=1.5), "argument 'margin': expected a 32-bit integer"),
    (dict(margin=2 ** 40), "argument 'margin': expected a 32-bit integer"),
    (dict(reduce_amax=2), "argument 'reduce_amax': expected a bool"),
    (dict(amax_epsilon="0"), "argument 'amax_epsilon'"),
    (dict(power_2_scale=True, power_of_2_scales=False), "aliases"),
])
def test_bad_options_python_side(kwargs, text):
    with pytest.raises(libte.InvalidArgument) as e:
        libte.Recipe(**kwargs)
    assert text in str(e.value)
    assert e.value.status == libte.constants.ERROR_INVALID_ARGUMENT


@pytest.mark.parametrize("kwargs, field", [
    (dict(amax_history_len=0), "amax_history_len"),
    (dict(margin=-1), "margin"),
    (dict(kind="current", amax_epsilon=-1.0), "amax_epsilon"),
])
def test_bad_options_c_side_message_names_field(kwargs, field):
    with pytest.raises(libte.InvalidArgument) as e:
        libte.Recipe(**kwargs)
    assert "te_recipe_create" in str(e.value) and field in str(e.value)
    assert libte.last_error() == str(e.value)
