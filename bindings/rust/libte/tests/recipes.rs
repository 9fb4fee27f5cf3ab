use libte::*;

#[test]
fn defaults_follow_te() {
    let delayed = RecipeOptions::new(RecipeKind::DelayedScaling);
    assert_eq!(delayed.format, Format::Hybrid);
    assert_eq!(delayed.margin, 0);
    assert_eq!(delayed.amax_history_len, 1024);
    assert_eq!(delayed.amax_algo, AmaxAlgo::Max);
    assert!(delayed.reduce_amax);
    assert!(!delayed.power_of_2_scales);
    assert_eq!(delayed.amax_epsilon, 0.0);
    assert!(!delayed.fprop_split_accumulator);
    assert!(delayed.dgrad_split_accumulator);
    assert!(delayed.wgrad_split_accumulator);
    assert_eq!(RecipeOptions::default(), delayed);

    let block = RecipeOptions::new(RecipeKind::BlockScaling);
    assert_eq!(block.format, Format::E4M3);
    assert!(block.power_of_2_scales);
    let current = RecipeOptions::new(RecipeKind::CurrentScaling);
    assert_eq!(current.format, Format::Hybrid);
    assert!(!current.power_of_2_scales);
}

#[test]
fn options_round_trip() {
    let opts = RecipeOptions {
        format: Format::E4M3,
        margin: 3,
        amax_history_len: 16,
        amax_algo: AmaxAlgo::MostRecent,
        reduce_amax: false,
        ..RecipeOptions::new(RecipeKind::DelayedScaling)
    };
    let recipe = Recipe::new(&opts).unwrap();
    assert_eq!(recipe.options().unwrap(), opts);
    for kind in [RecipeKind::CurrentScaling, RecipeKind::BlockScaling] {
        let opts = RecipeOptions {
            amax_epsilon: 1e-6,
            ..RecipeOptions::new(kind)
        };
        assert_eq!(Recipe::new(&opts).unwrap().options().unwrap(), opts);
    }
}

#[test]
fn keys_equal_iff_options_equal() {
    let a = Recipe::new(&RecipeOptions {
        amax_history_len: 16,
        ..Default::default()
    })
    .unwrap();
    let b = Recipe::new(&RecipeOptions {
        amax_history_len: 16,
        ..Default::default()
    })
    .unwrap();
    let c = Recipe::new(&RecipeOptions {
        amax_history_len: 32,
        ..Default::default()
    })
    .unwrap();
    let d = Recipe::current_scaling().unwrap();
    let e = Recipe::block_scaling().unwrap();
    assert_ne!(a.key(), 0);
    assert_eq!(a.key(), b.key());
    assert_eq!(a, b);
    let keys = [a.key(), c.key(), d.key(), e.key()];
    for i in 0..keys.len() {
        for j in 0..i {
            assert_ne!(keys[i], keys[j], "recipes {} and {}", i, j);
        }
    }
    let mut set = std::collections::HashSet::new();
    set.insert(a.clone());
    assert!(set.contains(&b));
    assert!(!set.contains(&c));
}

#[test]
fn describe_is_canonical() {
    let r = Recipe::delayed_scaling().unwrap();
    let text = r.describe();
    assert!(text.starts_with("delayed_scaling("), "{}", text);
    assert!(text.contains("HYBRID"), "{}", text);
    assert_eq!(format!("{}", r), text);
    assert_eq!(format!("{:?}", r), format!("Recipe({:?})", text));
    assert!(Recipe::block_scaling()
        .unwrap()
        .describe()
        .starts_with("block_scaling("));
}

#[test]
fn clone_shares_one_recipe() {
    let r = Recipe::delayed_scaling().unwrap();
    let copies: Vec<Recipe> = (0..100).map(|_| r.clone()).collect();
    drop(r);
    for c in &copies {
        assert_eq!(c.as_ptr(), copies[0].as_ptr());
        assert!(c.describe().starts_with("delayed_scaling("));
    }
}

#[test]
fn recipes_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Recipe>();
    let r = Recipe::current_scaling().unwrap();
    let key = r.key();
    let keys: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| r.clone().key())).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(keys.iter().all(|&k| k == key));
}

#[test]
fn out_of_range_field_is_named() {
    let err = Recipe::new(&RecipeOptions {
        margin: 500,
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("margin"), "{}", err);
    assert!(err.message().starts_with("te_recipe_create"), "{}", err);

    let err = Recipe::new(&RecipeOptions {
        amax_history_len: 0,
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("amax_history_len"), "{}", err);

    let err = Recipe::new(&RecipeOptions {
        amax_epsilon: -1.0,
        ..RecipeOptions::new(RecipeKind::CurrentScaling)
    })
    .unwrap_err();
    assert!(err.message().contains("amax_epsilon"), "{}", err);
    assert_eq!(
        err.to_string(),
        format!("TE_ERROR_INVALID_ARGUMENT: {}", err.message())
    );
}
