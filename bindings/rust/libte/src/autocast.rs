//! `Autocast`: an FP8 autocast scope, opened by `new` and closed by `Drop` (or `end`).

use std::fmt;
use std::ops::Deref;
use std::ptr;

use libte_sys as sys;

use crate::context::Context;
use crate::error::{check, Result};
use crate::group::Group;
use crate::recipe::Recipe;

/// What an autocast scope does (`te_autocast_options`). Plain data: one value may open any
/// number of (nested) scopes.
///
/// `'r` borrows the recipe only until the scope is open (the scope holds its own reference);
/// `'g` borrows the group for as long as the scope is open (see [`Autocast::new`]).
#[derive(Debug, Clone, Copy)]
pub struct AutocastOptions<'r, 'g> {
    /// FP8 compute inside the scope. Default true.
    pub enabled: bool,
    /// High-precision compute with amaxes recorded. Default false.
    pub calibrating: bool,
    /// The recipe; `None` = libte's default delayed-scaling recipe. The scope holds its own
    /// reference while it is open.
    pub recipe: Option<&'r Recipe>,
    /// The process group the amaxes recorded in the scope are all-reduced over; `None` = the
    /// implicit single-rank group. The scope borrows it (and the context keeps it alive for what
    /// it reduces over the group after the scope, see [`Group`]).
    pub group: Option<&'g Group>,
}

impl Default for AutocastOptions<'_, '_> {
    fn default() -> Self {
        AutocastOptions {
            enabled: true,
            calibrating: false,
            recipe: None,
            group: None,
        }
    }
}

impl<'r, 'g> AutocastOptions<'r, 'g> {
    /// FP8 compute with `recipe`.
    pub fn fp8(recipe: &'r Recipe) -> AutocastOptions<'r, 'g> {
        AutocastOptions {
            recipe: Some(recipe),
            ..Default::default()
        }
    }

    /// A disabled scope: high precision inside, e.g. to run the same code without FP8.
    pub fn disabled() -> AutocastOptions<'r, 'g> {
        AutocastOptions {
            enabled: false,
            ..Default::default()
        }
    }

    /// With amaxes all-reduced over `group`.
    pub fn group<'h>(self, group: &'h Group) -> AutocastOptions<'r, 'h> {
        AutocastOptions {
            enabled: self.enabled,
            calibrating: self.calibrating,
            recipe: self.recipe,
            group: Some(group),
        }
    }

    fn to_raw(self) -> sys::te_autocast_options {
        let mut raw = sys::te_autocast_options::default();
        // Cannot fail for a non-NULL pointer; the fields are all set below anyway.
        let _ = unsafe { sys::te_autocast_options_init(&mut raw) };
        raw.struct_size = std::mem::size_of::<sys::te_autocast_options>();
        raw.enabled = self.enabled as i32;
        raw.calibrating = self.calibrating as i32;
        raw.recipe = self.recipe.map_or(ptr::null(), |r| r.as_ptr());
        raw.group = self.group.map_or(ptr::null(), |g| g.as_ptr());
        raw
    }
}

/// The innermost open scope of a context (`te_autocast_state`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AutocastState {
    /// FP8 compute in the innermost scope (false outside any scope).
    pub enabled: bool,
    /// Calibrating in the innermost scope.
    pub calibrating: bool,
    /// The innermost scope's recipe (libte's default when it gave none); `None` outside.
    pub recipe: Option<Recipe>,
    /// Open scopes.
    pub depth: usize,
}

impl AutocastState {
    pub(crate) fn query(ctx: &Context) -> Result<AutocastState> {
        let mut raw = sys::te_autocast_state {
            struct_size: std::mem::size_of::<sys::te_autocast_state>(),
            ..Default::default()
        };
        check(unsafe { sys::te_autocast_get_state(ctx.as_ptr(), &mut raw) })?;
        Ok(AutocastState {
            enabled: raw.enabled != 0,
            calibrating: raw.calibrating != 0,
            // The scope holds a reference; take our own before anything can close it.
            recipe: unsafe { Recipe::retain_raw(raw.recipe) },
            depth: raw.depth.max(0) as usize,
        })
    }
}

/// An open autocast scope on a context: `te_autocast_begin` in [`new`](Autocast::new),
/// `te_autocast_end` in `Drop` (or [`end`](Autocast::end), which reports errors).
///
/// The guard borrows the context mutably, so scopes nest correctly by construction: while it
/// lives, the only way to open another scope is [`nested`](Autocast::nested), whose guard
/// borrows this one, so the inner scope always ends first. The guard derefs to `&Context` for
/// every other call:
///
/// ```no_run
/// # use libte::*;
/// let mut ctx = Context::cpu()?;
/// let recipe = Recipe::delayed_scaling()?;
/// let mut fp8 = Autocast::new(&mut ctx, &AutocastOptions::fp8(&recipe))?;
/// assert_eq!(fp8.autocast_state()?.depth, 1);
/// {
///     let hp = fp8.nested(&AutocastOptions::disabled())?;
///     assert_eq!(hp.autocast_state()?.depth, 2);
/// } // inner scope ends
/// fp8.end()?; // outer scope ends; forward scales are updated here
/// # Ok::<(), libte::Error>(())
/// ```
///
/// Leaking a guard (`mem::forget`) leaves its scope open; later scopes then nest inside it.
pub struct Autocast<'c> {
    ctx: &'c mut Context,
    token: sys::te_autocast_token,
    open: bool,
}

impl<'c> Autocast<'c> {
    /// Opens a scope on `ctx`. Errors: `InvalidState` beyond 64 nested scopes.
    ///
    /// The guard borrows the options' group (`'c`), so the group cannot be dropped while the
    /// scope is open; the context keeps it alive after that for as long as libte may reduce
    /// over it.
    pub fn new(ctx: &'c mut Context, opts: &AutocastOptions<'_, 'c>) -> Result<Autocast<'c>> {
        let raw = opts.to_raw();
        let mut token: sys::te_autocast_token = 0;
        check(unsafe { sys::te_autocast_begin(ctx.as_ptr(), &raw, &mut token) })?;
        if let Some(group) = opts.group {
            ctx.shared().use_group(group.handle());
        }
        Ok(Autocast {
            ctx,
            token,
            open: true,
        })
    }

    /// Opens a scope inside this one; it ends before this one can.
    pub fn nested<'s>(&'s mut self, opts: &AutocastOptions<'_, 's>) -> Result<Autocast<'s>> {
        Autocast::new(&mut *self.ctx, opts)
    }

    /// The scope's token (`te_autocast_token`).
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The context, for calls inside the scope (the guard also derefs to it).
    pub fn context(&self) -> &Context {
        self.ctx
    }

    /// Ends the scope now and reports how that went: when no enclosing scope is enabled, this
    /// is where the forward amaxes are reduced and the scales updated, which on a GPU can fail.
    /// `Drop` does the same and ignores the error. On an error libte leaves the scope as it was.
    pub fn end(mut self) -> Result<()> {
        self.open = false;
        let token = self.token;
        check(
            self.ctx
                .reducing(|ctx| unsafe { sys::te_autocast_end(ctx, token) }),
        )
    }
}

impl Deref for Autocast<'_> {
    type Target = Context;

    fn deref(&self) -> &Context {
        self.ctx
    }
}

impl Drop for Autocast<'_> {
    fn drop(&mut self) {
        if self.open {
            // Innermost by construction; an error here can only come from the device, and
            // Drop has no way to report it (use `end` to see it).
            let token = self.token;
            let _ = self
                .ctx
                .reducing(|ctx| unsafe { sys::te_autocast_end(ctx, token) });
        }
    }
}

impl fmt::Debug for Autocast<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Autocast")
            .field("token", &self.token)
            .field("open", &self.open)
            .finish()
    }
}

// Context's autocast methods live here, with the scope they open, so that this module depends on
// context.rs and not the other way round.
impl Context {
    /// Opens an autocast scope; same as [`Autocast::new`].
    pub fn autocast<'c>(&'c mut self, opts: &AutocastOptions<'_, 'c>) -> Result<Autocast<'c>> {
        Autocast::new(self, opts)
    }

    /// The innermost open scope (or "none": depth 0).
    pub fn autocast_state(&self) -> Result<AutocastState> {
        AutocastState::query(self)
    }
}
