//! `Recipe`: an immutable, reference-counted FP8 recipe (`te_recipe`).

use std::ffi::CStr;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ptr::{self, NonNull};

use libte_sys as sys;

use crate::error::{check, Error, Result, Status};

/// How scales are computed (`te_recipe_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecipeKind {
    /// Per-tensor scales from an amax history (TE's `DelayedScaling`).
    DelayedScaling,
    /// Per-tensor scales from each tensor's own amax (`Float8CurrentScaling`).
    CurrentScaling,
    /// 1x128 blocks for activations and gradients, 128x128 for weights (`Float8BlockScaling`).
    BlockScaling,
}

/// Which FP8 formats a recipe uses (`te_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// E4M3 forward (activations, weights), E5M2 backward (gradients).
    Hybrid,
    /// E4M3 everywhere.
    E4M3,
}

/// How delayed scaling reduces the amax history (`te_amax_algo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AmaxAlgo {
    /// The maximum over the window.
    Max,
    /// The most recent amax.
    MostRecent,
}

macro_rules! raw_enum {
    ($rust:ident, $raw:ident, $($variant:ident <=> $c:ident),+ $(,)?) => {
        impl $rust {
            pub(crate) fn to_raw(self) -> sys::$raw {
                match self { $($rust::$variant => sys::$raw::$c),+ }
            }
            pub(crate) fn from_raw(raw: sys::$raw) -> Result<$rust> {
                $(if raw == sys::$raw::$c { return Ok($rust::$variant); })+
                Err(Error::new(
                    Status::Unsupported,
                    format!("{} value {} is newer than this binding", stringify!($raw), raw.0),
                ))
            }
        }
    };
}

raw_enum!(RecipeKind, te_recipe_kind,
    DelayedScaling <=> TE_RECIPE_DELAYED_SCALING,
    CurrentScaling <=> TE_RECIPE_CURRENT_SCALING,
    BlockScaling <=> TE_RECIPE_BLOCK_SCALING);
raw_enum!(Format, te_format, Hybrid <=> TE_FORMAT_HYBRID, E4M3 <=> TE_FORMAT_E4M3);
raw_enum!(AmaxAlgo, te_amax_algo, Max <=> TE_AMAX_MAX, MostRecent <=> TE_AMAX_MOST_RECENT);

/// A recipe's options (`te_recipe_options`), with TE's names. Start from
/// [`RecipeOptions::new`], which fills TE's defaults for the kind (from libte itself), and
/// change fields with struct-update syntax:
///
/// ```no_run
/// # use libte::{RecipeOptions, RecipeKind, Recipe};
/// let recipe = Recipe::new(&RecipeOptions {
///     amax_history_len: 16,
///     ..RecipeOptions::new(RecipeKind::DelayedScaling)
/// })?;
/// # Ok::<(), libte::Error>(())
/// ```
///
/// Not `#[non_exhaustive]`, so that struct-update syntax works outside this crate; a field the
/// C struct gains later will be added here in a new minor version of this crate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecipeOptions {
    /// The kind; set by `new`.
    pub kind: RecipeKind,
    /// Delayed and current scaling: `Hybrid`; block scaling: `E4M3`.
    pub format: Format,
    /// Delayed: `scale = (fp8_max / amax) / 2^margin`; 0..=127, default 0.
    pub margin: i32,
    /// Delayed: 1..=65536, default 1024.
    pub amax_history_len: i32,
    /// Delayed: default `Max`.
    pub amax_algo: AmaxAlgo,
    /// All-reduce amaxes over the autocast group; default true.
    pub reduce_amax: bool,
    /// Current, block: keep only the scale's exponent. Default false; block scaling: true.
    pub power_of_2_scales: bool,
    /// Current, block: amax clamped up to this; >= 0, default 0.
    pub amax_epsilon: f32,
    /// Split accumulator in the forward GEMM; default false (fast accumulation).
    pub fprop_split_accumulator: bool,
    /// Split accumulator in the dgrad GEMM; default true.
    pub dgrad_split_accumulator: bool,
    /// Split accumulator in the wgrad GEMM; default true.
    pub wgrad_split_accumulator: bool,
}

impl RecipeOptions {
    /// TE's defaults for `kind`, as `te_recipe_options_init` fills them.
    pub fn new(kind: RecipeKind) -> RecipeOptions {
        let mut raw = sys::te_recipe_options::default();
        // Fails only for NULL or an unknown kind, neither possible here. Should it fail anyway,
        // the zeroed struct has struct_size 0, which te_recipe_create reports.
        let _ = unsafe { sys::te_recipe_options_init(&mut raw, kind.to_raw()) };
        raw.kind = kind.to_raw();
        RecipeOptions::from_raw_lossy(&raw, kind)
    }

    fn from_raw_lossy(raw: &sys::te_recipe_options, kind: RecipeKind) -> RecipeOptions {
        RecipeOptions {
            kind,
            format: Format::from_raw(raw.format).unwrap_or(Format::Hybrid),
            margin: raw.margin,
            amax_history_len: raw.amax_history_len,
            amax_algo: AmaxAlgo::from_raw(raw.amax_algo).unwrap_or(AmaxAlgo::Max),
            reduce_amax: raw.reduce_amax != 0,
            power_of_2_scales: raw.power_of_2_scales != 0,
            amax_epsilon: raw.amax_epsilon,
            fprop_split_accumulator: raw.fprop_split_accumulator != 0,
            dgrad_split_accumulator: raw.dgrad_split_accumulator != 0,
            wgrad_split_accumulator: raw.wgrad_split_accumulator != 0,
        }
    }

    fn from_raw(raw: &sys::te_recipe_options) -> Result<RecipeOptions> {
        Ok(RecipeOptions {
            kind: RecipeKind::from_raw(raw.kind)?,
            format: Format::from_raw(raw.format)?,
            amax_algo: AmaxAlgo::from_raw(raw.amax_algo)?,
            ..RecipeOptions::from_raw_lossy(raw, RecipeKind::DelayedScaling)
        })
    }

    fn to_raw(self) -> sys::te_recipe_options {
        let mut raw = sys::te_recipe_options::default();
        let _ = unsafe { sys::te_recipe_options_init(&mut raw, self.kind.to_raw()) };
        raw.struct_size = std::mem::size_of::<sys::te_recipe_options>();
        raw.kind = self.kind.to_raw();
        raw.format = self.format.to_raw();
        raw.margin = self.margin;
        raw.amax_history_len = self.amax_history_len;
        raw.amax_algo = self.amax_algo.to_raw();
        raw.reduce_amax = self.reduce_amax as i32;
        raw.power_of_2_scales = self.power_of_2_scales as i32;
        raw.amax_epsilon = self.amax_epsilon;
        raw.fprop_split_accumulator = self.fprop_split_accumulator as i32;
        raw.dgrad_split_accumulator = self.dgrad_split_accumulator as i32;
        raw.wgrad_split_accumulator = self.wgrad_split_accumulator as i32;
        raw
    }
}

impl Default for RecipeOptions {
    /// Delayed scaling with TE's defaults.
    fn default() -> Self {
        RecipeOptions::new(RecipeKind::DelayedScaling)
    }
}

/// An immutable FP8 recipe (`te_recipe`). `Clone` adds a reference (`te_recipe_retain`), `Drop`
/// drops one (`te_recipe_release`). `Send` and `Sync`: recipes are immutable and thread-safe.
///
/// Equality and hashing follow [`key`](Recipe::key): two recipes are equal when every field
/// that affects numerics is.
pub struct Recipe {
    raw: NonNull<sys::te_recipe>,
}

unsafe impl Send for Recipe {}
unsafe impl Sync for Recipe {}

impl Recipe {
    /// A recipe with these options; out-of-range fields are an `InvalidArgument` naming them.
    pub fn new(opts: &RecipeOptions) -> Result<Recipe> {
        let raw_opts = opts.to_raw();
        let mut raw = ptr::null_mut();
        check(unsafe { sys::te_recipe_create(&mut raw, &raw_opts) })?;
        Recipe::own(raw)
    }

    /// TE's default recipe: delayed scaling, HYBRID, history 1024.
    pub fn delayed_scaling() -> Result<Recipe> {
        Recipe::new(&RecipeOptions::new(RecipeKind::DelayedScaling))
    }

    /// Current scaling with TE's defaults.
    pub fn current_scaling() -> Result<Recipe> {
        Recipe::new(&RecipeOptions::new(RecipeKind::CurrentScaling))
    }

    /// Block scaling with TE's defaults.
    pub fn block_scaling() -> Result<Recipe> {
        Recipe::new(&RecipeOptions::new(RecipeKind::BlockScaling))
    }

    fn own(raw: *mut sys::te_recipe) -> Result<Recipe> {
        NonNull::new(raw)
            .map(|raw| Recipe { raw })
            .ok_or_else(|| Error::new(Status::Internal, "te_recipe_create returned NULL"))
    }

    /// Takes a new reference to a recipe libte handed out (e.g. the autocast state's).
    ///
    /// # Safety
    /// `raw` must be a live recipe.
    pub(crate) unsafe fn retain_raw(raw: *const sys::te_recipe) -> Option<Recipe> {
        NonNull::new(sys::te_recipe_retain(raw as *mut sys::te_recipe)).map(|raw| Recipe { raw })
    }

    /// A 64-bit key computed at creation from every field that affects numerics: equal options
    /// give equal keys and different options different keys, within one process. Never 0.
    pub fn key(&self) -> u64 {
        unsafe { sys::te_recipe_key(self.raw.as_ptr()) }
    }

    /// The canonical description, e.g. `delayed_scaling(format=HYBRID,margin=0,...)`.
    pub fn describe(&self) -> &str {
        // Built at creation, valid while the recipe lives, never NULL for a valid recipe.
        let text = unsafe { CStr::from_ptr(sys::te_recipe_describe(self.raw.as_ptr())) };
        text.to_str().unwrap_or("")
    }

    /// The recipe's options.
    pub fn options(&self) -> Result<RecipeOptions> {
        let mut raw = sys::te_recipe_options {
            struct_size: std::mem::size_of::<sys::te_recipe_options>(),
            ..Default::default()
        };
        check(unsafe { sys::te_recipe_get_options(self.raw.as_ptr(), &mut raw) })?;
        RecipeOptions::from_raw(&raw)
    }

    /// The raw handle, valid while `self` lives (retain it to keep it longer).
    pub fn as_ptr(&self) -> *const sys::te_recipe {
        self.raw.as_ptr()
    }
}

impl Clone for Recipe {
    fn clone(&self) -> Recipe {
        unsafe { sys::te_recipe_retain(self.raw.as_ptr()) };
        Recipe { raw: self.raw }
    }
}

impl Drop for Recipe {
    fn drop(&mut self) {
        unsafe { sys::te_recipe_release(self.raw.as_ptr()) }
    }
}

impl PartialEq for Recipe {
    fn eq(&self, other: &Recipe) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Recipe {}

impl Hash for Recipe {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}

impl fmt::Debug for Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Recipe").field(&self.describe()).finish()
    }
}

impl fmt::Display for Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}
