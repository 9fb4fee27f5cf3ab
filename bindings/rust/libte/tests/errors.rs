//! Bad input is an `Err` with libte's status and message, never a panic or UB.

mod common;

use common::*;
use libte::*;

fn bf16_layer(ctx: &Context) -> Linear {
    Linear::new(ctx, &LinearOptions::new(64, 32)).unwrap()
}

#[test]
fn wrong_dtype_is_reported_with_the_argument() {
    let ctx = Context::cpu().unwrap();
    let mut fc = bf16_layer(&ctx); // BF16 activations
    let mut bufs = ForwardBuffers::new([16, 64, 32], 0.0, 0.0);
    let (args, mut y) = bufs.views();
    let err = fc.forward(&ctx, &args, &mut y).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert_eq!(
        err.message(),
        "te_linear_forward: argument 'args->input': expected dtype BF16, got F32"
    );
    assert!(
        bufs.y.iter().all(|&v| v == 0.0),
        "outputs untouched on failure"
    );
}

#[test]
fn wrong_shape_is_reported() {
    let ctx = Context::cpu().unwrap();
    let mut fc = f32_linear(&ctx, 64, 32);
    let x = vec![0.0f32; 16 * 48];
    let w = vec![0.0f32; 32 * 64];
    let b = vec![0.0f32; 32];
    let mut y = vec![0.0f32; 16 * 32];
    let args = ForwardArgs::new(view(&x, &[16, 48]), view(&w, &[32, 64])).bias(view(&b, &[32]));
    let err = fc
        .forward(&ctx, &args, &mut view_mut(&mut y, &[16, 32]))
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(
        err.message()
            .starts_with("te_linear_forward: argument 'args->input'"),
        "{}",
        err
    );
    assert!(
        err.message().contains("64") && err.message().contains("48"),
        "{}",
        err
    );

    // A bias given to a layer without one.
    let mut nobias = Linear::new(
        &ctx,
        &LinearOptions {
            bias: false,
            activation_dtype: DType::F32,
            ..LinearOptions::new(64, 32)
        },
    )
    .unwrap();
    let x = vec![0.0f32; 16 * 64];
    let args = ForwardArgs::new(view(&x, &[16, 64]), view(&w, &[32, 64])).bias(view(&b, &[32]));
    let err = nobias
        .forward(&ctx, &args, &mut view_mut(&mut y, &[16, 32]))
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("bias"), "{}", err);
}

#[test]
fn fp8_shape_not_multiple_of_16_is_unsupported() {
    let mut ctx = Context::cpu().unwrap();
    let mut fc = f32_linear(&ctx, 64, 32);
    let mut bufs = ForwardBuffers::new([10, 64, 32], 0.1, 0.1);
    let (args, mut y) = bufs.views();
    let scope = ctx.autocast(&AutocastOptions::default()).unwrap();
    let err = fc.forward(&scope, &args, &mut y).unwrap_err();
    assert_eq!(err.status(), Status::Unsupported);
    assert!(err.message().contains("16"), "{}", err);
}

#[test]
fn slice_and_shape_disagree() {
    let data = vec![0.0f32; 10];
    let err = TensorView::from_slice(&data, &[3, 4]).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert_eq!(
        err.message(),
        "TensorView::from_slice: argument 'data': expected 12 elements for shape [3, 4], got a slice of 10"
    );
    let err = TensorView::from_slice(&data, &[1; 9]).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("1..=8 dimensions, got 9"), "{}", err);
    let err = TensorView::from_slice(&data, &[]).unwrap_err();
    assert!(err.message().contains("got 0"), "{}", err);
    let err = TensorView::from_slice(&data, &[usize::MAX, 2]).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    let mut out = vec![0.0f32; 10];
    let err = TensorViewMut::from_slice(&mut out, &[11]).unwrap_err();
    assert!(
        err.message().starts_with("TensorViewMut::from_slice"),
        "{}",
        err
    );
}

#[test]
fn zero_dimension_is_reported_by_libte() {
    let ctx = Context::cpu().unwrap();
    let empty: Vec<f32> = Vec::new();
    let x = TensorView::from_slice(&empty, &[0, 4]).unwrap(); // consistent, but libte wants >= 1
    let mut y_data: Vec<f32> = Vec::new();
    let mut y = TensorViewMut::from_slice(&mut y_data, &[0, 4]).unwrap();
    let err = ctx
        .activation_forward(Activation::Relu, &x, &mut y)
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(
        err.message().starts_with("te_activation_forward"),
        "{}",
        err
    );
}

#[test]
fn fp8_views_check_their_scale_inv() {
    let mut codes = vec![0u8; 4 * 256];
    let mut scale_inv = vec![0.0f32; 7];
    let err = TensorViewMut::from_fp8(
        &mut codes,
        DType::E4M3,
        &[4, 256],
        &mut scale_inv,
        ScalingMode::Block1x128,
    )
    .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("expected 8 floats"), "{}", err);
    let mut scale_inv = vec![0.0f32; 8];
    TensorViewMut::from_fp8(
        &mut codes,
        DType::E4M3,
        &[4, 256],
        &mut scale_inv,
        ScalingMode::Block1x128,
    )
    .unwrap();
    let err = TensorView::from_fp8(
        &codes,
        DType::F32,
        &[4, 256],
        &scale_inv,
        ScalingMode::PerTensor,
    )
    .unwrap_err();
    assert!(err.message().contains("expected E4M3 or E5M2"), "{}", err);
}

#[test]
fn quantize_rejects_a_non_fp8_output() {
    let ctx = Context::cpu().unwrap();
    let x = vec![1.0f32; 16];
    let mut out = vec![0.0f32; 16];
    let err = ctx
        .quantize(
            &view(&x, &[16]),
            &mut view_mut(&mut out, &[16]),
            QuantizeScale::default(),
        )
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().starts_with("te_quantize"), "{}", err);
}

#[test]
fn bad_linear_options_are_named() {
    let ctx = Context::cpu().unwrap();
    let err = Linear::new(&ctx, &LinearOptions::new(0, 32)).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert_eq!(
        err.message(),
        "te_linear_create: argument 'opts->in_features': expected > 0, got 0"
    );
    let err = Linear::new(
        &ctx,
        &LinearOptions {
            activation_dtype: DType::E4M3,
            ..LinearOptions::new(16, 16)
        },
    )
    .unwrap_err();
    assert!(err.message().contains("activation_dtype"), "{}", err);
}

#[test]
fn a_layer_of_another_context_is_rejected() {
    let ctx_a = Context::cpu().unwrap();
    let ctx_b = Context::cpu().unwrap();
    let mut fc = f32_linear(&ctx_a, 64, 32);
    let mut bufs = ForwardBuffers::new([16, 64, 32], 0.0, 0.0);
    let (args, mut y) = bufs.views();
    let err = fc.forward(&ctx_b, &args, &mut y).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert_eq!(
        err.message(),
        "te_linear_forward: argument 'lin': created with another te_context than 'ctx'"
    );
    let err = fc.state_save(&ctx_b).unwrap_err();
    assert!(err.message().contains("another te_context"), "{}", err);

    // A backward context of another context, too.
    let mut bwd = fc.forward(&ctx_a, &args, &mut y).unwrap();
    let dy = vec![0.0f32; 16 * 32];
    let err = bwd
        .backward(&ctx_b, &view(&dy, &[16, 32]), None, None, None)
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("another te_context"), "{}", err);
}

#[test]
fn backward_with_wrong_gradient_shapes() {
    let ctx = Context::cpu().unwrap();
    let mut fc = f32_linear(&ctx, 64, 32);
    let mut bufs = ForwardBuffers::new([16, 64, 32], 0.5, 0.5);
    let (args, mut y) = bufs.views();
    let mut bwd = fc.forward(&ctx, &args, &mut y).unwrap();
    let dy = vec![1.0f32; 16 * 32];
    let mut dx = vec![0.0f32; 16 * 32]; // should be [16, 64]
    let err = bwd
        .backward(
            &ctx,
            &view(&dy, &[16, 32]),
            Some(&mut view_mut(&mut dx, &[16, 32])),
            None,
            None,
        )
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("dx"), "{}", err);
    assert!(dx.iter().all(|&v| v == 0.0));
    // dy of the wrong dtype
    let dy16 = vec![Bf16::from_f32(1.0); 16 * 32];
    let err = bwd
        .backward(
            &ctx,
            &TensorView::from_slice(&dy16, &[16, 32]).unwrap(),
            None,
            None,
            None,
        )
        .unwrap_err();
    assert!(err.message().contains("dy"), "{}", err);
}

#[test]
fn bad_state_buffers_are_rejected() {
    let ctx = Context::cpu().unwrap();
    let mut fc = f32_linear(&ctx, 64, 32);
    let state = fc.state_save(&ctx).unwrap();
    let err = fc.state_load(&ctx, &state[..state.len() / 2]).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().starts_with("te_linear_state_load"), "{}", err);
    let err = fc.state_load(&ctx, &[]).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    let mut other = f32_linear(&ctx, 32, 32);
    let err = other.state_load(&ctx, &state).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    // A failed load changed nothing.
    assert_eq!(fc.state_save(&ctx).unwrap(), state);
}

#[test]
fn errors_display_and_compare() {
    let e = Error::new(Status::Unsupported, "x");
    assert_eq!(e.to_string(), "TE_ERROR_UNSUPPORTED: x");
    assert_eq!(Status::Unknown(99).name(), "TE_ERROR_UNKNOWN");
    assert_eq!(Status::from_raw(sys::te_status::TE_SUCCESS), None);
    assert_eq!(Status::from_raw(sys::te_status(7)), Some(Status::Nccl));
    assert_eq!(
        Status::from_raw(sys::te_status(42)),
        Some(Status::Unknown(42))
    );
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(e.clone());
    assert_eq!(boxed.to_string(), e.to_string());
}

#[test]
fn the_message_belongs_to_the_failing_call() {
    // A later successful call does not change the error already returned; a later failing
    // call's message is its own.
    let ctx = Context::cpu().unwrap();
    let e1 = Linear::new(&ctx, &LinearOptions::new(0, 1)).unwrap_err();
    let _ok = Recipe::delayed_scaling().unwrap();
    let e2 = Recipe::new(&RecipeOptions {
        margin: -1,
        ..Default::default()
    })
    .unwrap_err();
    assert!(e1.message().contains("in_features"));
    assert!(e2.message().contains("margin"));
}
