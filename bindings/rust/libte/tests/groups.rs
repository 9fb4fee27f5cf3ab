//! Process groups: the single-rank group in autocast scopes, NCCL ids, and the NCCL calls'
//! argument checks (which come before libte looks for a GPU, so they run everywhere).

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use libte::*;

#[test]
fn single_group_has_one_rank_and_a_fresh_id() {
    let g = Group::single().unwrap();
    assert_eq!(g.rank(), 0);
    assert_eq!(g.size(), 1);
    assert_ne!(g.id(), 0, "0 names the implicit group");
    let text = format!("{:?}", g);
    assert!(text.contains(&format!("id: {}", g.id())), "{}", text);

    // Ids are process-unique and never reused, even after a group is dropped.
    let mut ids: HashSet<u64> = (0..8).map(|_| Group::single().unwrap().id()).collect();
    assert_eq!(ids.len(), 8);
    assert!(ids.insert(g.id()));
    drop(g);
    assert!(ids.insert(Group::single().unwrap().id()));
}

#[test]
fn nccl_id_round_trips_through_bytes() {
    assert_eq!(NCCL_ID_BYTES, 128);
    let mut bytes = [0u8; NCCL_ID_BYTES];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i * 37 + 200) as u8; // every byte differs from its neighbours, some above 127
    }
    let id = NcclId::from_bytes(&bytes);
    assert_eq!(id.as_bytes(), &bytes);
    let copy = NcclId::from_bytes(id.as_bytes());
    assert_eq!(copy, id);
    assert_ne!(NcclId::from_bytes(&[0; NCCL_ID_BYTES]), id);
    let text = format!("{:?}", id);
    assert!(
        text.starts_with("NcclId(c8ed12") && text.ends_with("..)"),
        "{}",
        text
    );
}

/// Whether this machine can make NCCL groups: `nccl_unique_id` succeeds or is `Unsupported`.
fn nccl_usable() -> Option<NcclId> {
    match nccl_unique_id() {
        Ok(id) => Some(id),
        Err(err) => {
            assert_eq!(err.status(), Status::Unsupported, "{}", err);
            assert!(
                err.message().starts_with("te_nccl_get_unique_id: "),
                "{}",
                err
            );
            None
        }
    }
}

#[test]
fn nccl_groups_need_a_gpu() {
    let id = match nccl_usable() {
        Some(id) => id,
        None => {
            // No GPU (or no NCCL): valid arguments reach the GPU check and are Unsupported.
            let id = NcclId::from_bytes(&[0; NCCL_ID_BYTES]);
            for timeout in [None, Some(Duration::from_secs(5)), Some(Duration::ZERO)] {
                let err = Group::init_nccl(0, 1, &id, timeout).unwrap_err();
                assert_eq!(err.status(), Status::Unsupported, "{}", err);
                assert!(err.message().starts_with("te_group_init_nccl"), "{}", err);
                assert!(err.message().len() > "te_group_init_nccl: ".len());
            }
            return;
        }
    };
    // A usable GPU with NCCL: a one-rank communicator of our own, which we may abort.
    let g = Group::init_nccl(0, 1, &id, Some(Duration::from_secs(120))).unwrap();
    assert_eq!((g.rank(), g.size()), (0, 1));
    g.abort().unwrap();
    g.abort().unwrap(); // a no-op
}

#[test]
fn bad_ranks_are_named() {
    // libte checks these before it looks for a GPU or NCCL, so this holds everywhere.
    let id = NcclId::from_bytes(&[0; NCCL_ID_BYTES]);
    let err = Group::init_nccl(2, 2, &id, None).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().starts_with("te_group_init_nccl"), "{}", err);
    assert!(
        err.message()
            .ends_with(": argument 'rank': expected 0..1, got 2"),
        "{}",
        err
    );
    let err = Group::init_nccl(3, 2, &id, Some(Duration::from_secs(1))).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(
        err.message()
            .starts_with("te_group_init_nccl_with_options: argument 'rank'"),
        "{}",
        err
    );
    let err = Group::init_nccl(0, 0, &id, None).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("argument 'nranks'"), "{}", err);

    // What does not fit libte's int32 is this crate's to reject, in libte's style.
    let err = Group::init_nccl(usize::MAX, 2, &id, None).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert_eq!(
        err.message(),
        format!(
            "Group::init_nccl: argument 'rank': expected at most i32::MAX, got {}",
            usize::MAX
        )
    );
    let err = Group::init_nccl(0, 1 << 31, &id, None).unwrap_err();
    assert!(err.message().contains("argument 'nranks'"), "{}", err);
}

#[test]
fn timeouts_beyond_i32_milliseconds_are_rejected_before_libte() {
    let id = NcclId::from_bytes(&[0; NCCL_ID_BYTES]);
    // Valid rank and size: on a GPU, libte would try to join; the crate must refuse first.
    let too_long = Duration::from_millis(i32::MAX as u64 + 1);
    let err = Group::init_nccl(0, 1, &id, Some(too_long)).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert_eq!(
        err.message(),
        "Group::init_nccl: argument 'timeout': expected at most i32::MAX ms, got 2147483648 ms"
    );
    let err = Group::init_nccl(0, 1, &id, Some(Duration::MAX)).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("'timeout'"), "{}", err);
}

#[test]
fn abort_of_a_single_rank_group_is_invalid_state() {
    let g = Group::single().unwrap();
    let err = g.abort().unwrap_err();
    assert_eq!(err.status(), Status::InvalidState);
    assert!(err.message().starts_with("te_group_abort: "), "{}", err);
    // From a watchdog thread, as abort is meant to be called.
    let err = std::thread::scope(|s| s.spawn(|| g.abort().unwrap_err()).join().unwrap());
    assert_eq!(err.status(), Status::InvalidState);
}

fn forward_in_scope(
    ctx: &mut Context,
    fc: &mut Linear,
    opts: &AutocastOptions<'_, '_>,
) -> Vec<f32> {
    let mut bufs = ForwardBuffers::new([16, 64, 32], 0.25, 0.5);
    {
        let (args, mut y) = bufs.views();
        let scope = Autocast::new(ctx, opts).unwrap();
        let _bwd = fc.forward(&scope, &args, &mut y).unwrap();
        scope.end().unwrap();
    }
    bufs.y
}

#[test]
fn scope_with_a_single_rank_group_runs_a_linear_forward() {
    let recipe = Recipe::delayed_scaling().unwrap();
    let group = Group::single().unwrap();

    let mut ctx = Context::cpu().unwrap();
    let mut fc = f32_linear(&ctx, 64, 32);
    let before = ctx.stats().unwrap();
    let y = forward_in_scope(
        &mut ctx,
        &mut fc,
        &AutocastOptions::fp8(&recipe).group(&group),
    );
    let after = ctx.stats().unwrap();
    // x = 0.25, W = 0.5 are exact in E4M3: every y is 64 * 0.125.
    assert!(y.iter().all(|&v| v == 8.0), "{:?}", &y[..4]);
    assert_eq!(after.scopes_closed, before.scopes_closed + 1);
    assert_eq!(after.bucket_updates, before.bucket_updates + 1);
    assert_eq!(
        after.amax_reductions, before.amax_reductions,
        "one rank: nothing to reduce"
    );

    // The same as with the implicit group.
    let mut ctx2 = Context::cpu().unwrap();
    let mut fc2 = f32_linear(&ctx2, 64, 32);
    let y2 = forward_in_scope(&mut ctx2, &mut fc2, &AutocastOptions::fp8(&recipe));
    assert_eq!(y, y2);
    let scale = |ctx: &Context, fc: &Linear| fc.scaling_state(ctx, TensorRole::Input).unwrap();
    assert_eq!(scale(&ctx, &fc), scale(&ctx2, &fc2));
}

#[test]
fn the_context_keeps_a_group_libte_still_reduces_over() {
    // libte reduces over a scope's group after the scope ends: the outer pass's scale update,
    // the backward of a forward saved in the scope. The group's handle may be gone by then.
    let mut ctx = Context::cpu().unwrap();
    let mut fc = f32_linear(&ctx, 64, 32);
    let mut bufs = ForwardBuffers::new([16, 64, 32], 0.25, 0.5);
    let (args, mut y) = bufs.views();
    let mut bwd = {
        let mut outer = ctx.autocast(&AutocastOptions::default()).unwrap();
        let group = Group::single().unwrap();
        let bwd = {
            let inner = outer
                .nested(&AutocastOptions::default().group(&group))
                .unwrap();
            fc.forward(&inner, &args, &mut y).unwrap()
        };
        drop(group);
        outer.end().unwrap(); // updates the bucket of (default recipe, group)
        bwd
    };
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
    assert!(dx.iter().all(|&v| v != 0.0));
    ctx.flush_backward().unwrap();
    drop(ctx); // the te_context, then the group, go with the last handle
    drop(fc);
    drop(bwd);
}

#[test]
fn one_group_serves_many_contexts_and_threads() {
    let group = Group::single().unwrap();
    let recipe = Recipe::current_scaling().unwrap();
    let outputs: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut ctx = Context::cpu().unwrap();
                    let mut fc = f32_linear(&ctx, 64, 32);
                    let opts = AutocastOptions::fp8(&recipe).group(&group);
                    (0..3)
                        .map(|_| forward_in_scope(&mut ctx, &mut fc, &opts))
                        .last()
                        .unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Current scaling: 8 up to the rounding of scale_inv = amax / 448; the same in every thread.
    for y in &outputs {
        assert_eq!(y, &outputs[0]);
        assert!(y.iter().all(|&v| (v - 8.0).abs() < 1e-5), "{:?}", &y[..4]);
    }
}
