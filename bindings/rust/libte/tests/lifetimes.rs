//! Handles may be dropped in any order and on any thread; the context outlives them all.

mod common;

use common::*;
use libte::*;

fn assert_send<T: Send>() {}

#[test]
fn send_and_sync_where_sound() {
    assert_send::<Context>();
    assert_send::<Linear>();
    assert_send::<BackwardCtx<'static>>();
    assert_send::<Residuals<'static>>();
    assert_send::<Recipe>();
    assert_send::<Error>();
    // A group is shared with a watchdog thread that may abort it.
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Group>();
    assert_send_sync::<NcclId>();
    // Not Sync (Context, Linear, BackwardCtx) and the autocast nesting rules are checked by
    // the compile_fail doctests in src/lib.rs (`compile_checks`).
}

fn trained_step(ctx: &mut Context, fc: &mut Linear, x: &[f32], w: &[f32]) -> BackwardCtx<'static> {
    // 'static data so the backward context can outlive this function.
    let x: &'static [f32] = Box::leak(x.to_vec().into_boxed_slice());
    let w: &'static [f32] = Box::leak(w.to_vec().into_boxed_slice());
    let mut y = vec![0.0f32; 16 * 32];
    let args = ForwardArgs::new(view(x, &[16, 64]), view(w, &[32, 64]));
    let scope = ctx.autocast(&AutocastOptions::default()).unwrap();
    fc.forward(&scope, &args, &mut view_mut(&mut y, &[16, 32]))
        .unwrap()
}

fn no_bias_layer(ctx: &Context) -> Linear {
    Linear::new(
        ctx,
        &LinearOptions {
            bias: false,
            activation_dtype: DType::F32,
            ..LinearOptions::new(64, 32)
        },
    )
    .unwrap()
}

#[test]
fn context_dropped_before_its_layers() {
    let mut ctx = Context::cpu().unwrap();
    let mut fc = no_bias_layer(&ctx);
    let x = fill(5, 16 * 64);
    let w = fill(6, 32 * 64);
    let bwd = trained_step(&mut ctx, &mut fc, &x, &w);
    drop(ctx); // the te_context stays alive for fc and bwd
    drop(fc);
    drop(bwd); // the last one destroys the te_context
}

#[test]
fn layers_dropped_while_the_context_is_used() {
    let mut ctx = Context::cpu().unwrap();
    let x = fill(5, 16 * 64);
    let w = fill(6, 32 * 64);
    for _ in 0..20 {
        let mut fc = no_bias_layer(&ctx);
        let mut bwd = trained_step(&mut ctx, &mut fc, &x, &w);
        drop(fc); // a backward context keeps what it needs
        let dy = vec![0.01f32; 16 * 32];
        let mut dx = vec![0.0f32; 16 * 64];
        bwd.backward(
            &ctx,
            &view(&dy, &[16, 32]),
            Some(&mut view_mut(&mut dx, &[16, 64])),
            None,
            None,
        )
        .unwrap();
        assert!(dx.iter().any(|&v| v != 0.0));
    }
}

#[test]
fn handles_dropped_on_other_threads() {
    let mut ctx = Context::cpu().unwrap();
    let x = fill(5, 16 * 64);
    let w = fill(6, 32 * 64);
    let mut layers = Vec::new();
    let mut bwds = Vec::new();
    for _ in 0..8 {
        let mut fc = no_bias_layer(&ctx);
        bwds.push(trained_step(&mut ctx, &mut fc, &x, &w));
        layers.push(fc);
    }
    // Drop them elsewhere while this thread keeps using the context.
    let dropper = std::thread::spawn(move || {
        drop(bwds);
        drop(layers);
    });
    for _ in 0..50 {
        let mut fc = no_bias_layer(&ctx);
        let _bwd = trained_step(&mut ctx, &mut fc, &x, &w);
    }
    dropper.join().unwrap();
    // And the context itself can move to another thread.
    let moved = std::thread::spawn(move || {
        let mut fc = no_bias_layer(&ctx);
        let x = fill(5, 16 * 64);
        let w = fill(6, 32 * 64);
        let _bwd = trained_step(&mut ctx, &mut fc, &x, &w);
        ctx.stats().unwrap().scopes_closed
    });
    assert_eq!(moved.join().unwrap(), 59);
}

#[test]
fn residuals_not_saved_are_released() {
    let mut ctx = Context::cpu().unwrap();
    let mut fc = no_bias_layer(&ctx);
    let x = fill(5, 16 * 64);
    let w = fill(6, 32 * 64);
    let mut y = vec![0.0f32; 16 * 32];
    for _ in 0..10 {
        let args = ForwardArgs::new(view(&x, &[16, 64]), view(&w, &[32, 64]));
        let scope = ctx.autocast(&AutocastOptions::default()).unwrap();
        let res = fc
            .forward_compute(&scope, &args, &mut view_mut(&mut y, &[16, 32]))
            .unwrap();
        assert!(res.fp8());
        drop(res);
    }
}
