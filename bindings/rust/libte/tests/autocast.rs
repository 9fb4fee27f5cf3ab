use libte::*;

#[test]
fn scopes_nest_and_report_state() {
    let mut ctx = Context::cpu().unwrap();
    let recipe = Recipe::current_scaling().unwrap();
    assert_eq!(ctx.autocast_state().unwrap().depth, 0);
    assert!(ctx.autocast_state().unwrap().recipe.is_none());
    {
        let mut outer = Autocast::new(&mut ctx, &AutocastOptions::fp8(&recipe)).unwrap();
        let state = outer.autocast_state().unwrap();
        assert_eq!(state.depth, 1);
        assert!(state.enabled);
        assert_eq!(state.recipe.as_ref(), Some(&recipe));
        {
            let mut inner = outer.nested(&AutocastOptions::disabled()).unwrap();
            let state = inner.autocast_state().unwrap();
            assert_eq!(state.depth, 2);
            assert!(!state.enabled);
            // No recipe: the default delayed-scaling one.
            assert!(state
                .recipe
                .unwrap()
                .describe()
                .starts_with("delayed_scaling("));
            {
                let cal = AutocastOptions {
                    enabled: false,
                    calibrating: true,
                    recipe: Some(&recipe),
                    group: None,
                };
                let innermost = inner.nested(&cal).unwrap();
                let state = innermost.autocast_state().unwrap();
                assert_eq!(state.depth, 3);
                assert!(state.calibrating);
                assert_ne!(innermost.token(), 0);
            }
            assert_eq!(inner.autocast_state().unwrap().depth, 2);
        }
        assert_eq!(outer.autocast_state().unwrap().depth, 1);
    }
    assert_eq!(ctx.autocast_state().unwrap().depth, 0);
    assert_eq!(ctx.stats().unwrap().scopes_closed, 3);
}

#[test]
fn explicit_end_reports_and_closes() {
    let mut ctx = Context::cpu().unwrap();
    let before = ctx.stats().unwrap().scopes_closed;
    let mut outer = ctx.autocast(&AutocastOptions::default()).unwrap();
    let inner = outer.nested(&AutocastOptions::default()).unwrap();
    inner.end().unwrap();
    assert_eq!(outer.autocast_state().unwrap().depth, 1);
    outer.end().unwrap();
    assert_eq!(ctx.autocast_state().unwrap().depth, 0);
    assert_eq!(ctx.stats().unwrap().scopes_closed, before + 2);
}

#[test]
fn the_scope_keeps_its_recipe() {
    let mut ctx = Context::cpu().unwrap();
    let recipe = Recipe::block_scaling().unwrap();
    let key = recipe.key();
    let guard = Autocast::new(&mut ctx, &AutocastOptions::fp8(&recipe)).unwrap();
    drop(recipe); // the scope holds its own reference
    let state = guard.autocast_state().unwrap();
    assert_eq!(state.recipe.unwrap().key(), key);
}

fn nest(guard: &mut Autocast<'_>, depth: usize) -> Result<usize> {
    if depth == 0 {
        return Ok(guard.autocast_state()?.depth);
    }
    let mut inner = guard.nested(&AutocastOptions::default())?;
    nest(&mut inner, depth - 1)
}

#[test]
fn depth_limit_is_an_error_not_a_panic() {
    let mut ctx = Context::cpu().unwrap();
    let mut root = Autocast::new(&mut ctx, &AutocastOptions::default()).unwrap();
    assert_eq!(nest(&mut root, 63).unwrap(), 64);
    let err = nest(&mut root, 64).unwrap_err();
    assert_eq!(err.status(), Status::InvalidState);
    assert!(err.message().starts_with("te_autocast_begin"), "{}", err);
    assert!(err.message().contains("64"), "{}", err);
    // Every scope the failed attempt opened was closed again.
    assert_eq!(root.autocast_state().unwrap().depth, 1);
    drop(root);
    assert_eq!(ctx.autocast_state().unwrap().depth, 0);
}

#[test]
fn scope_end_updates_forward_scales() {
    let mut ctx = Context::cpu().unwrap();
    let recipe = Recipe::new(&RecipeOptions {
        amax_history_len: 4,
        ..Default::default()
    })
    .unwrap();
    let mut fc = Linear::new(
        &ctx,
        &LinearOptions {
            activation_dtype: DType::F32,
            bias: false,
            ..LinearOptions::new(32, 16)
        },
    )
    .unwrap();
    let x = vec![2.0f32; 16 * 32];
    let w = vec![0.5f32; 16 * 32];
    let mut y = vec![0.0f32; 16 * 16];
    let args = ForwardArgs::new(
        TensorView::from_slice(&x, &[16, 32]).unwrap(),
        TensorView::from_slice(&w, &[16, 32]).unwrap(),
    );
    let before = ctx.stats().unwrap();
    {
        let fp8 = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
        let _bwd = fc
            .forward(
                &fp8,
                &args,
                &mut TensorViewMut::from_slice(&mut y, &[16, 16]).unwrap(),
            )
            .unwrap();
        fp8.end().unwrap();
    }
    let after = ctx.stats().unwrap();
    assert_eq!(after.bucket_updates, before.bucket_updates + 1);
    let input = fc.scaling_state(&ctx, TensorRole::Input).unwrap();
    assert_eq!(input.amax_history.len(), 4);
    // amax 2 -> scale = 448 / 2.
    assert_eq!(input.scale, 224.0);
    assert_eq!(input.scale_inv, 1.0 / 224.0);
    assert_eq!(input.fp8_dtype, Some(DType::E4M3));
    assert!(y.iter().all(|&v| v == 32.0), "{:?}", &y[..4]);
}
