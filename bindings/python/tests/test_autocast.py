import numpy as np
import pytest

import libte


def test_scope_state_and_depth(ctx):
    r = libte.Recipe(kind="current")
    assert ctx.autocast_state().depth == 0
    with libte.autocast(ctx, recipe=r) as ac:
        s = ctx.autocast_state()
        assert (s.enabled, s.calibrating, s.depth) == (True, False, 1)
        assert s.recipe_key == r.key and s.recipe_describe == r.describe
        assert ac.depth == 1
    assert ctx.autocast_state().depth == 0
    assert ctx.stats().scopes_closed == 1


def test_default_recipe_is_delayed(ctx):
    with libte.autocast(ctx):
        assert ctx.autocast_state().recipe_describe.startswith("delayed_scaling(")


def test_nested_use_of_one_object(ctx):
    ac = libte.autocast(ctx, recipe=libte.Recipe())
    with ac:
        with ac:
            with ac:
                assert ctx.autocast_state().depth == 3 and ac.depth == 3
            assert ctx.autocast_state().depth == 2
        assert ac.depth == 1
    assert ctx.autocast_state().depth == 0 and ac.depth == 0


def test_disabled_and_calibrating(ctx):
    with libte.autocast(ctx, enabled=False):
        assert not ctx.autocast_state().enabled
        with libte.autocast(ctx, calibrating=True, enabled=False):
            s = ctx.autocast_state()
            assert s.calibrating and s.depth == 2


def test_out_of_order_end_raises_and_changes_nothing(ctx):
    outer = libte.autocast(ctx)
    inner = libte.autocast(ctx, enabled=False)
    outer.begin()
    inner.begin()
    with pytest.raises(libte.InvalidState) as e:
        outer.end()
    assert "te_autocast_end" in str(e.value) and "innermost" in str(e.value)
    assert e.value.status == libte.constants.ERROR_INVALID_STATE
    assert ctx.autocast_state().depth == 2 and outer.depth == 1
    inner.end()
    outer.end()
    assert ctx.autocast_state().depth == 0


def test_end_without_begin(ctx):
    with pytest.raises(libte.InvalidState, match="no open scope"):
        libte.autocast(ctx).end()


def test_depth_limit(ctx):
    ac = libte.autocast(ctx)
    for _ in range(libte.constants.AUTOCAST_MAX_DEPTH):
        ac.begin()
    with pytest.raises(libte.InvalidState) as e:
        ac.begin()
    assert "te_autocast_begin" in str(e.value)
    assert ac.depth == libte.constants.AUTOCAST_MAX_DEPTH
    while ac.depth:
        ac.end()


def test_exception_inside_scope_closes_it(ctx):
    with pytest.raises(KeyError):
        with libte.autocast(ctx):
            raise KeyError("boom")
    assert ctx.autocast_state().depth == 0


def test_group_and_bad_arguments(ctx):
    g = libte.Group.single()
    assert g.id != 0 and g.rank == 0 and g.size == 1
    assert libte.Group.single().id != g.id
    with libte.autocast(ctx, group=g):
        pass
    g.close()  # the context still holds it until it closes
    with pytest.raises(libte.InvalidArgument, match="argument 'ctx'"):
        libte.autocast(None)
    with pytest.raises(libte.InvalidArgument, match="argument 'recipe'"):
        libte.autocast(ctx, recipe="delayed")
    with pytest.raises(libte.InvalidArgument, match="argument 'group'"):
        libte.autocast(ctx, group=1)


def test_closed_context(ctx):
    ac = libte.autocast(ctx)
    ctx.close()
    with pytest.raises(libte.InvalidState, match="Context is closed"):
        ac.begin()
    with pytest.raises(libte.InvalidState, match="Context is closed"):
        libte.autocast(ctx)


def test_scale_updates_once_per_bucket(ctx, rng):
    lin = libte.Linear(ctx, 32, 16)
    x = rng.standard_normal((16, 32)).astype(np.float32)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    b = np.zeros(16, np.float32)
    with libte.autocast(ctx, recipe=libte.Recipe(amax_history_len=4)):
        lin.forward(x, w, b)
        lin.forward(x, w, b)
    assert ctx.stats().bucket_updates == 1
