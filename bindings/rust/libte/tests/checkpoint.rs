//! Checkpoints: tensors and byte strings round-trip exactly through a file and a buffer; names,
//! replacement, and the refusals te.h lists (missing records, wrong dtype or shape, a byte
//! record read as a tensor, a short buffer, truncated or corrupted data) with nothing changed.

mod common;

use common::*;
use libte::*;

fn temp_path(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "libte-rs-ckpt-{}-{}.teckpt",
        std::process::id(),
        tag
    ))
}

/// A checkpoint with an F32 matrix, an I32 vector, a BF16 tensor and two byte records.
fn sample(ctx: &Context) -> (Checkpoint, Vec<f32>, Vec<i32>, Vec<Bf16>) {
    let w = fill(1, 12 * 5);
    let ids: Vec<i32> = vec![3, -7, i32::MAX, i32::MIN, 0];
    let h: Vec<Bf16> = fill(2, 2 * 3 * 4)
        .iter()
        .map(|&v| Bf16::from_f32(v))
        .collect();
    let mut ck = Checkpoint::new().unwrap();
    assert!(ck.is_empty().unwrap());
    ck.put_tensor(ctx, "model.fc1.weight", &view(&w, &[12, 5]))
        .unwrap();
    ck.put_tensor(
        ctx,
        "data.ids",
        &TensorView::from_slice(&ids, &[5]).unwrap(),
    )
    .unwrap();
    ck.put_tensor(ctx, "h", &TensorView::from_slice(&h, &[2, 3, 4]).unwrap())
        .unwrap();
    ck.put_bytes("step", &42u64.to_le_bytes()).unwrap();
    ck.put_bytes("empty", &[]).unwrap();
    (ck, w, ids, h)
}

fn check_sample(ctx: &Context, ck: &Checkpoint, w: &[f32], ids: &[i32], h: &[Bf16]) {
    let mut names = ck.names().unwrap();
    names.sort();
    assert_eq!(
        names,
        ["data.ids", "empty", "h", "model.fc1.weight", "step"]
    );
    assert_eq!(ck.len().unwrap(), 5);
    let mut w2 = vec![0.0f32; w.len()];
    ck.get_tensor(ctx, "model.fc1.weight", &mut view_mut(&mut w2, &[12, 5]))
        .unwrap();
    assert_eq!(w2, w);
    let mut ids2 = vec![0i32; ids.len()];
    ck.get_tensor(
        ctx,
        "data.ids",
        &mut TensorViewMut::from_slice(&mut ids2, &[5]).unwrap(),
    )
    .unwrap();
    assert_eq!(ids2, ids);
    let mut h2 = vec![Bf16::from_f32(0.0); h.len()];
    ck.get_tensor(
        ctx,
        "h",
        &mut TensorViewMut::from_slice(&mut h2, &[2, 3, 4]).unwrap(),
    )
    .unwrap();
    assert_eq!(h2, h);
    assert_eq!(ck.get_bytes("step").unwrap(), 42u64.to_le_bytes());
    assert_eq!(ck.bytes_len("step").unwrap(), 8);
    assert_eq!(ck.get_bytes("empty").unwrap(), Vec::<u8>::new());
}

#[test]
fn records_round_trip_in_memory_through_a_buffer_and_a_file() {
    let ctx = Context::cpu().unwrap();
    let (ck, w, ids, h) = sample(&ctx);
    check_sample(&ctx, &ck, &w, &ids, &h);

    let bytes = ck.serialize().unwrap();
    assert_eq!(&bytes[..6], b"TECKPT", "the format's magic");
    let back = Checkpoint::deserialize(&bytes).unwrap();
    check_sample(&ctx, &back, &w, &ids, &h);
    assert_eq!(
        back.serialize().unwrap(),
        bytes,
        "serialisation is deterministic"
    );

    let path = temp_path("roundtrip");
    ck.write(&path).unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the file holds the serialised bytes"
    );
    let read = Checkpoint::read(&path).unwrap();
    check_sample(&ctx, &read, &w, &ids, &h);
    // Written again: replaced.
    let mut small = Checkpoint::new().unwrap();
    small.put_bytes("only", b"x").unwrap();
    small.write(&path).unwrap();
    assert_eq!(Checkpoint::read(&path).unwrap().names().unwrap(), ["only"]);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn putting_a_name_again_replaces_the_record() {
    let ctx = Context::cpu().unwrap();
    let mut ck = Checkpoint::new().unwrap();
    ck.put_bytes("a", b"first").unwrap();
    let t = fill(3, 4);
    ck.put_tensor(&ctx, "a", &view(&t, &[2, 2])).unwrap();
    assert_eq!(ck.len().unwrap(), 1);
    let mut out = vec![0.0f32; 4];
    ck.get_tensor(&ctx, "a", &mut view_mut(&mut out, &[2, 2]))
        .unwrap();
    assert_eq!(out, t);
    ck.put_bytes("a", b"second").unwrap();
    assert_eq!(ck.get_bytes("a").unwrap(), b"second");
}

#[test]
fn bad_requests_are_refused_and_leave_the_output_untouched() {
    let ctx = Context::cpu().unwrap();
    let (mut ck, ..) = sample(&ctx);
    let invalid = |e: Error, func: &str| {
        assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
        assert!(e.message().starts_with(func), "{}: {}", func, e);
    };
    let mut out = vec![9.0f32; 60];
    // No such record, wrong shape, wrong dtype, a byte record read as a tensor.
    invalid(
        ck.get_tensor(&ctx, "nope", &mut view_mut(&mut out, &[12, 5]))
            .unwrap_err(),
        "te_checkpoint_get_tensor",
    );
    invalid(
        ck.get_tensor(&ctx, "model.fc1.weight", &mut view_mut(&mut out, &[5, 12]))
            .unwrap_err(),
        "te_checkpoint_get_tensor",
    );
    let mut ints = vec![9i32; 60];
    invalid(
        ck.get_tensor(
            &ctx,
            "model.fc1.weight",
            &mut TensorViewMut::from_slice(&mut ints, &[12, 5]).unwrap(),
        )
        .unwrap_err(),
        "te_checkpoint_get_tensor",
    );
    let mut eight = vec![9.0f32; 2];
    invalid(
        ck.get_tensor(&ctx, "step", &mut view_mut(&mut eight, &[2]))
            .unwrap_err(),
        "te_checkpoint_get_tensor",
    );
    assert!(out.iter().chain(&eight).all(|&v| v == 9.0) && ints.iter().all(|&v| v == 9));
    // A tensor record read as bytes; a buffer too small (untouched).
    invalid(
        ck.get_bytes("model.fc1.weight").unwrap_err(),
        "te_checkpoint_get_bytes",
    );
    let mut small = [7u8; 4];
    invalid(
        ck.get_bytes_into("step", &mut small).unwrap_err(),
        "te_checkpoint_get_bytes",
    );
    assert_eq!(small, [7u8; 4]);
    // Names: empty, too long, with a NUL (refused by the binding).
    invalid(
        ck.put_bytes("", b"x").unwrap_err(),
        "te_checkpoint_put_bytes",
    );
    invalid(
        ck.put_bytes(&"n".repeat(256), b"x").unwrap_err(),
        "te_checkpoint_put_bytes",
    );
    ck.put_bytes(&"n".repeat(255), b"x").unwrap();
    let e = ck.put_bytes("a\0b", b"x").unwrap_err();
    assert!(
        e.message()
            .starts_with("Checkpoint::put_bytes: argument 'name'"),
        "{}",
        e
    );
    // FP8 tensors are refused.
    let codes = vec![0u8; 16];
    let si = vec![1.0f32];
    let fp8 =
        TensorView::from_fp8(&codes, DType::E4M3, &[4, 4], &si, ScalingMode::PerTensor).unwrap();
    invalid(
        ck.put_tensor(&ctx, "fp8", &fp8).unwrap_err(),
        "te_checkpoint_put_tensor",
    );
    assert_eq!(ck.len().unwrap(), 6, "only the 255-byte name was added");
}

#[test]
fn truncated_or_corrupted_checkpoints_are_refused() {
    let ctx = Context::cpu().unwrap();
    let (ck, ..) = sample(&ctx);
    let bytes = ck.serialize().unwrap();
    for cut in [0usize, 5, 6, bytes.len() / 2, bytes.len() - 1] {
        let e = Checkpoint::deserialize(&bytes[..cut]).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "cut at {}: {}", cut, e);
        assert!(
            e.message().starts_with("te_checkpoint_deserialize"),
            "{}",
            e
        );
    }
    // Every byte flipped in turn (one in 7 to keep it quick): the CRC or a check catches it.
    for i in (0..bytes.len()).step_by(7) {
        let mut bad = bytes.clone();
        bad[i] ^= 0x5A;
        assert!(
            Checkpoint::deserialize(&bad).is_err(),
            "flipping byte {} was accepted",
            i
        );
    }
    let path = temp_path("corrupt");
    let mut bad = bytes.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    let e = Checkpoint::read(&path).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
    assert!(e.message().starts_with("te_checkpoint_read"), "{}", e);
    std::fs::remove_file(&path).unwrap();
    let e = Checkpoint::read(temp_path("does-not-exist")).unwrap_err();
    assert!(e.message().starts_with("te_checkpoint_read"), "{}", e);
}

/// A training state saved and restored: a Linear's scaling state bytes plus its weights and
/// AdamW moments, through a file, continue exactly as the original.
#[test]
fn a_module_state_and_optimizer_moments_restore_exactly() {
    let mut ctx = Context::cpu().unwrap();
    let recipe = Recipe::delayed_scaling().unwrap();
    let mut fc = f32_linear(&ctx, 16, 16);
    let x = fill(1, 16 * 16);
    let w = fill(2, 16 * 16);
    let b = vec![0.0f32; 16];
    let mut y = vec![0.0f32; 16 * 16];
    {
        let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
        let args = ForwardArgs::new(view(&x, &[16, 16]), view(&w, &[16, 16])).bias(view(&b, &[16]));
        fc.forward(&scope, &args, &mut view_mut(&mut y, &[16, 16]))
            .unwrap();
    }
    let state = fc.state_save(&ctx).unwrap();
    let m = fill(3, 16 * 16);
    let mut ck = Checkpoint::new().unwrap();
    ck.put_bytes("fc.state", &state).unwrap();
    ck.put_tensor(&ctx, "fc.weight", &view(&w, &[16, 16]))
        .unwrap();
    ck.put_tensor(&ctx, "fc.weight.exp_avg", &view(&m, &[16, 16]))
        .unwrap();
    let path = temp_path("training");
    ck.write(&path).unwrap();
    drop(ck);

    let back = Checkpoint::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let mut fc2 = f32_linear(&ctx, 16, 16);
    fc2.state_load(&ctx, &back.get_bytes("fc.state").unwrap())
        .unwrap();
    let (mut w2, mut m2) = (vec![0.0f32; 16 * 16], vec![0.0f32; 16 * 16]);
    back.get_tensor(&ctx, "fc.weight", &mut view_mut(&mut w2, &[16, 16]))
        .unwrap();
    back.get_tensor(&ctx, "fc.weight.exp_avg", &mut view_mut(&mut m2, &[16, 16]))
        .unwrap();
    assert_eq!((&w2, &m2), (&w, &m));
    assert_eq!(fc2.state_save(&ctx).unwrap(), state);
    // The next FP8 forward of both is identical.
    let (mut ya, mut yb) = (vec![0.0f32; 256], vec![0.0f32; 256]);
    {
        let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
        let a = ForwardArgs::new(view(&x, &[16, 16]), view(&w, &[16, 16])).bias(view(&b, &[16]));
        fc.forward(&scope, &a, &mut view_mut(&mut ya, &[16, 16]))
            .unwrap();
        let a2 = ForwardArgs::new(view(&x, &[16, 16]), view(&w2, &[16, 16])).bias(view(&b, &[16]));
        fc2.forward(&scope, &a2, &mut view_mut(&mut yb, &[16, 16]))
            .unwrap();
    }
    assert_eq!(ya, yb);
}

#[test]
fn record_info_describes_each_record_so_a_reader_can_allocate() {
    let ctx = Context::cpu().unwrap();
    let (ck, w, ..) = sample(&ctx);
    let expected = |name: &str| match name {
        "model.fc1.weight" => RecordInfo::Tensor {
            dtype: DType::F32,
            shape: vec![12, 5],
            size: 60 * 4,
        },
        "data.ids" => RecordInfo::Tensor {
            dtype: DType::I32,
            shape: vec![5],
            size: 5 * 4,
        },
        "h" => RecordInfo::Tensor {
            dtype: DType::BF16,
            shape: vec![2, 3, 4],
            size: 24 * 2,
        },
        "step" => RecordInfo::Bytes { size: 8 },
        "empty" => RecordInfo::Bytes { size: 0 },
        other => panic!("unexpected record {}", other),
    };
    let path = temp_path("record-info");
    ck.write(&path).unwrap();
    let read = Checkpoint::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    for c in [&ck, &read] {
        for name in c.names().unwrap() {
            let info = c.record_info(&name).unwrap();
            assert_eq!(info, expected(&name), "{}", name);
            assert_eq!(info.is_tensor(), name != "step" && name != "empty");
            if let RecordInfo::Tensor { dtype, shape, size } = &info {
                let n: i64 = shape.iter().product();
                assert_eq!(*size, n as usize * dtype.size(), "{}", name);
            }
        }
    }
    assert_eq!(read.record_info("step").unwrap().size(), 8);

    // Allocating from the info is enough for get_tensor.
    let shape = match read.record_info("model.fc1.weight").unwrap() {
        RecordInfo::Tensor { shape, .. } => shape,
        other => panic!("model.fc1.weight is a tensor record, got {:?}", other),
    };
    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    let mut w2 = vec![0.0f32; dims.iter().product()];
    read.get_tensor(&ctx, "model.fc1.weight", &mut view_mut(&mut w2, &dims))
        .unwrap();
    assert_eq!(w2, w);

    // A missing record and a NUL in the name: InvalidArgument naming the function.
    let e = read.record_info("nope").unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
    assert!(
        e.message().starts_with("te_checkpoint_record_info") && e.message().contains("nope"),
        "{}",
        e
    );
    let e = read.record_info("a\0b").unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
    assert!(e.message().starts_with("Checkpoint::record_info"), "{}", e);
    assert_eq!(read.len().unwrap(), 5);
}
